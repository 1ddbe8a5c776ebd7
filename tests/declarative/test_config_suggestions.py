"""Did-you-mean in declarative config errors: a misspelt key or a value outside a
setting's choices gets the closest spelling the config takes there, beside its key path."""

from __future__ import annotations

import pytest

from raylight.base.exceptions import ConfigError
from raylight.declarative.loading import load_config
from raylight.declarative.suggest import keys_at, validate_config
from tests.declarative_data import write

BASE = {"input_features": [{"name": "a", "type": "number"}], "output_features": [{"name": "b", "type": "binary"}]}


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    return str(err.value)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({**BASE, "trainer": {"epoch": 3}}, "trainer.epoch: unknown key; check the spelling against the documented settings; did you mean 'epochs'?"),
        ({**BASE, "combiner": {"fc_layer": []}}, "combiner.fc_layer: unknown key; check the spelling against the documented settings; did you mean 'fc_layers'?"),
        ({**BASE, "trainer": {"optimizer": {"type": "adamm"}}}, "(got 'adamm'); did you mean 'adam'?"),
        ({**BASE, "backend": {"type": "rey"}}, "backend.type: Input should be"),
        ({**BASE, "input_features": [{"name": "a", "type": "number", "preprocesing": {}}]}, "input_features.0.preprocesing: unknown key; check the spelling against the documented settings; did you mean 'preprocessing'?"),
        ({**BASE, "input_features": [{"name": "a", "type": "nmber"}]}, "; did you mean 'number'?"),
        ({**BASE, "output_features": [{"name": "b", "type": "binary", "treshold": 0.3}]}, "output_features.0.treshold: unknown key; check the spelling against the documented settings; did you mean 'threshold'?"),
        ({**BASE, "output_features": [{"name": "b", "type": "categroy"}]}, "(got 'categroy'); did you mean 'category'?"),
        ({**BASE, "preprocessing": {"split": {"tpe": "random"}}}, "preprocessing.split.tpe: unknown key; check the spelling against the documented settings; did you mean 'type'?"),
        ({**BASE, "trainer": {"learning_rate_scheduler": {"warmup_fractoin": 0.1}}}, "did you mean 'warmup_fraction'?"),
    ],
)
def test_a_misspelling_names_the_spelling_meant(data, line):
    message = _error(data)
    assert line in message
    assert message.count("did you mean") == 1


def test_the_hint_is_given_only_where_a_spelling_is_close():
    message = _error({**BASE, "trainer": {"zzzzzz": 1}, "backend": {"type": "spark"}})
    assert "trainer.zzzzzz: unknown key" in message and "backend.type" in message and "did you mean" not in message


def test_each_error_gets_its_own_hint_in_order():
    lines = _error({**BASE, "trainer": {"epoch": 3, "batch_sise": 8}}).splitlines()[1:]
    assert sorted(line.rsplit("did you mean ", 1)[1] for line in lines) == ["'batch_size'?", "'epochs'?"]
    assert all(line.split(":")[0].strip().rsplit(".", 1)[1] in ("epoch", "batch_sise") for line in lines)


def test_the_keys_of_a_section_follow_the_types_the_data_names():
    data = {**BASE, "output_features": [{"name": "b", "type": "category"}]}
    assert "top_k" in keys_at(("output_features", 0), data) and "threshold" not in keys_at(("output_features", 0), data)
    assert "preprocessing" in keys_at(("input_features", 0), data)  # key paths without the tag: the type the data names
    assert keys_at(("trainer", "epochs"), data) == []  # a value, not a section


def test_config_files_get_the_hint(tmp_path):
    cfg, _ = write(tmp_path)
    with pytest.raises(ConfigError, match=r"trainer\.epoch: unknown key.*did you mean 'epochs'\?"):
        load_config(_with(cfg, "trainer: {epochs: 6", "trainer: {epoch: 6"))


def _with(path: str, old: str, new: str) -> str:
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    return path

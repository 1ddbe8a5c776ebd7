"""Declarative output types as a family: each built-in type is a module listed in
OUTPUTS, and a new type is one module plus one entry (tests/count_output.py, added here
with monkeypatch), taken up by the config, the metrics, preprocessing, the model,
training, evaluation and prediction."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config, render_config
from raylight.declarative.outputs import OUTPUTS, OutputType
from raylight.declarative.train import load_model
from tests import count_output
from tests.declarative_data import frame, write

MEMBERS = sorted({*OutputType.__annotations__, *(n for n in vars(OutputType) if not n.startswith("_"))})
COUNT = """\
input_features:
  - {name: age, type: number}
  - {name: workclass, type: category}
output_features:
  - {name: visits, type: count}
combiner: {type: concat, fc_layers: [{output_size: 16}]}
trainer: {epochs: 8, batch_size: 32, learning_rate: 0.01, validation_metric: mae}
backend: {type: local}
"""


def visits(n: int = 400, seed: int = 0):
    """frame() with a count target: Poisson, its rate rising with age and for gov workers."""
    df = frame(n, seed)
    rate = np.exp((df["age"].fillna(40) - 40) / 20 + 0.8 * (df["workclass"] == "gov"))
    return df.assign(visits=np.random.default_rng(seed + 1).poisson(rate))


@pytest.mark.parametrize("module", [*OUTPUTS.values(), count_output], ids=[*OUTPUTS, "count"])
def test_every_output_module_has_the_whole_interface(module):
    assert MEMBERS == [
        "METRICS", "Output", "RANKS", "WIDE", "add_sums", "block_summary", "check", "check_blocks", "check_target",
        "check_target_blocks", "decoder_size", "fit", "fit_ray", "loss", "metrics", "predicted", "predictions",
        "sum_names", "target_summary", "transform",
    ]
    for name in MEMBERS:
        assert hasattr(module, name), name


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_an_output_types_model_is_named_by_its_key(name):
    assert OUTPUTS[name].Output.model_fields["type"].annotation == Literal[name]
    assert OUTPUTS[name].METRICS[0] == "loss"


def test_a_new_output_type_is_one_module_and_one_entry(tmp_path, monkeypatch):
    cfg, data = write(tmp_path, df=visits(), config=COUNT)
    with pytest.raises(ConfigError, match=r"output_features\.0\.type: Input should be 'binary', 'category', 'number', 'set', 'vector', 'timeseries' or 'anomaly'"):
        load_config(cfg)
    with monkeypatch.context() as m:
        m.setitem(OUTPUTS, "count", count_output)
        # The config takes the type, with its own settings, key paths and metrics.
        config = load_config(cfg)
        out = config.output_features[0]
        assert isinstance(out, count_output.CountOutput) and out.max_count == 1000
        assert "type: count" in render_config(config) and "max_count: 1000" in render_config(config)
        assert load_config(render_config_file(tmp_path, config)).output_features[0] == out  # it loads as rendered
        with pytest.raises(ConfigError, match=r"output_features\.0\.max_count: Input should be greater than or equal to 1"):
            load_config(cfg, ["output_features.0.max_count=0"])
        with pytest.raises(ConfigError, match="threshold: a binary or set or anomaly output's setting; a count output has none"):
            load_config(cfg, ["output_features.0.threshold=0.9"])
        with pytest.raises(ConfigError, match=r"max_count: a count output's setting; a number output has none"):
            load_config(cfg, ["output_features.0.type=number", "output_features.0.max_count=5"])
        with pytest.raises(ConfigError, match=r"'accuracy' is not measured .*allowed: \['loss', 'mae'\]"):
            load_config(cfg, ["trainer.validation_metric=accuracy"])
        # Its target check runs in preprocessing.
        (tmp_path / "bad").mkdir()
        with pytest.raises(ConfigError, match=r"target column 'visits' \(count\) .* holds values that are no counts"):
            api.prepare(config, write(tmp_path / "bad", df=visits().assign(visits=-1), config=COUNT)[1])
        prepared = api.prepare(config, data)
        assert prepared.train["visits"].dtype == np.float32 and prepared.train["visits"].min() >= 0
        # Its decoder, loss and metrics train, and its predictions come back decoded.
        result = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
        model = load_model(result["model_path"])
        assert model.model.decoders["visits"].out_features == 1
        df = visits(300, seed=5)
        evaluated = model.evaluate(df)
        assert set(evaluated) == {"loss", "mae"}
        always_mean = float(np.abs(df["visits"] - df["visits"].mean()).mean())
        assert evaluated["mae"] < always_mean  # it learnt the rate, not only the mean
        pred = model.predict(df)
        assert list(pred.columns) == ["visits_predictions"] and (pred["visits_predictions"] > 0).all()
    # Gone from OUTPUTS, gone from the config.
    with pytest.raises(ConfigError, match=r"output_features\.0\.type: Input should be"):
        load_config(cfg)


def render_config_file(tmp_path, config) -> str:
    path = tmp_path / "rendered.yaml"
    path.write_text(render_config(config))
    return str(path)

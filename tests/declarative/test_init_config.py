"""`raylight init-config` on the project's own example datasets writes a config that trains
well, and a binary type never silently turns two labels into one."""

from __future__ import annotations

import json
import os
import sys

import pandas as pd
import pytest
import yaml

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.features import infer_type
from raylight.declarative.loading import load_config

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "declarative")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    pytest.importorskip("sklearn")
    sys.path.insert(0, EXAMPLES)
    try:
        from make_datasets import write_all
    finally:
        sys.path.remove(EXAMPLES)
    return write_all(str(tmp_path_factory.mktemp("data")))


@pytest.mark.parametrize("name,target", [("wine", "cultivar"), ("breast_cancer", "diagnosis")])
def test_init_config_trains_well_on_the_example_datasets(datasets, tmp_path, name, target):
    written = api.init_config(datasets[name], target)
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(yaml.safe_dump(written, sort_keys=False))
    out = api.train(load_config(str(cfg)), datasets[name], output_directory=str(tmp_path / "run"), backend="local", progress=False)
    test = out["evaluation"]["test"]
    # the hand-written examples reach 1.0 on these splits; 10 epochs of batch 64 reached 0.80
    assert test["accuracy"] >= 0.95, (written["trainer"], test)
    if "recall" in test:  # a binary target: both classes found, not one class predicted always
        assert test["recall"] > 0.8 and test["precision"] > 0.8, test


def test_the_trainer_section_follows_the_dataset_s_size():
    small, large = api.trainer_for(178), api.trainer_for(53_940)
    assert large == {"epochs": 10, "batch_size": "auto"}
    assert small["batch_size"] == 16 and small["early_stop"] == 10
    steps = small["epochs"] * -(-int(178 * 0.7) // small["batch_size"])
    assert steps >= api.INIT_STEPS  # not 20 steps: enough to train
    assert 16 <= api.trainer_for(10)["batch_size"] <= api.trainer_for(9_999)["batch_size"] <= 128
    assert api.trainer_for(10)["epochs"] == 100


def test_two_labels_are_a_category_not_a_binary():
    assert infer_type(pd.Series(["benign", "malignant", "benign"])) == "category"
    assert infer_type(pd.Series(["yes", "no", "yes"])) == "binary"
    assert infer_type(pd.Series([0, 1, 1])) == "binary"


def test_a_binary_column_of_two_labels_is_refused_naming_it(tmp_path):
    data = tmp_path / "d.csv"
    pd.DataFrame({"x": [0.1 * i for i in range(40)], "y": ["benign", "malignant"] * 20}).to_csv(data, index=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"input_features": [{"name": "x", "type": "number"}],
                               "output_features": [{"name": "y", "type": "binary"}], "trainer": {"epochs": 1}}))
    with pytest.raises(ConfigError, match=r"'y' is type binary, but its values \('benign', 'malignant'\).*type: category"):
        api.train(load_config(str(cfg)), str(data), output_directory=str(tmp_path / "run"), backend="local", progress=False)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())

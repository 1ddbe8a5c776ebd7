"""Timeseries outputs (Ludwig's): the target a series of future values, ``horizon`` of
them; its loss (huber by default), metrics and predictions against values computed here
from the model's predictions; a forecast of a trend learnt from the past values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.loading import load_config
from raylight.declarative.outputs import timeseries
from tests.declarative_data import write


def output(**settings):
    config = ModelConfig.model_validate({
        "input_features": [{"name": "a", "type": "number"}], "output_features": [{"name": "f", "type": "timeseries", **settings}],
    })
    return config.output_features[0]


def test_a_target_row_is_its_first_horizon_values_padded_and_a_row_without_one_is_dropped():
    out = output()
    assert out.loss.type == "huber" and out.loss.delta == 1.0 and out.horizon is None
    col = pd.Series(["1 2 3", "4 5", None, "6 7 8 9"])
    meta = timeseries.fit(col, out)
    assert meta == {"length": 4}  # the longest training row (Ludwig's horizon)
    array, keep = timeseries.transform(col, out, meta)
    assert array.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [0, 0, 0, 0], [6, 7, 8, 9]] and keep.tolist() == [True, True, False, True]
    short = output(horizon=2, preprocessing={"padding": "left", "padding_value": -1})
    meta = timeseries.fit(col, short)
    assert meta == {"length": 2} and timeseries.decoder_size(short, meta) == 2
    assert timeseries.transform(pd.Series(["5", "1 2 3"]), short, meta)[0].tolist() == [[-1, 5], [1, 2]]
    with pytest.raises(ConfigError, match=r"column 'f' \(output_features 'f', type timeseries\) holds values that are not series"):
        timeseries.check(pd.Series(["1 2", "1 x"]), out, "output_features")
    raw, target = torch.tensor([[0.0, 3.0]]), torch.tensor([[0.5, 0.0]])
    assert float(timeseries.loss(out)(raw, target)) == pytest.approx((0.5 * 0.25 + (3 - 0.5)) / 2)  # huber, delta 1
    assert float(timeseries.loss(output(loss={"type": "mean_absolute_error"}))(raw, target)) == pytest.approx(1.75)


def _trends(n: int, seed: int) -> pd.DataFrame:
    """Eight past values of a noisy line, and its next three (without noise)."""
    rng = np.random.default_rng(seed)
    level, slope = rng.normal(0, 1, n), rng.normal(0, 0.5, n)
    past = level[:, None] + slope[:, None] * np.arange(8) + rng.normal(0, 0.05, (n, 8))
    future = level[:, None] + slope[:, None] * np.arange(8, 11)
    return pd.DataFrame({"past": [" ".join(f"{v:.4f}" for v in r) for r in past], "future": [" ".join(f"{v:.4f}" for v in r) for r in future]})


CONFIG = """\
input_features:
  - {name: past, type: timeseries, encoder: {num_filters: 8, fc_layers: [{output_size: 16}]}}
output_features:
  - {name: future, type: timeseries, loss: {type: huber, weight: 1.0}}
trainer: {epochs: 12, batch_size: 32, learning_rate: 0.01, validation_metric: mean_squared_error}
preprocessing: {split: {type: random, probabilities: [0.7, 0.1, 0.2]}}
backend: {type: local}
"""


def test_a_forecast_of_a_trend_is_learnt_and_measured_as_ludwig_s(tmp_path):
    from raylight.declarative.train import load_model

    df = _trends(500, 0)
    df.loc[[3, 7], "future"] = None
    cfg, data = write(tmp_path, df=df, config=CONFIG)
    config = load_config(cfg)
    assert config.trainer.validation_metric == "mse"
    prepared = api.prepare(config, data)
    assert prepared.meta["future"] == {"length": 3}
    assert sum(len(s["future"]) for s in (prepared.train, prepared.validation, prepared.test)) == 498
    out = api.train(config, data, output_directory=str(tmp_path / "run"), progress=False)
    assert set(out["evaluation"]["test"]) == {"loss", "mse", "mae", "rmse", "r2"}
    assert out["evaluation"]["test"]["r2"] > 0.9, out["evaluation"]
    model = load_model(out["model_path"])
    fresh = _trends(150, 4)
    predicted = np.array(model.predict(fresh)["future_predictions"].tolist())
    truth = np.array([[float(x) for x in v.split()] for v in fresh["future"]])
    err = predicted - truth
    metrics = model.evaluate(fresh)
    assert metrics["mse"] == pytest.approx((err**2).mean(), rel=1e-4) and metrics["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-4)
    assert metrics["rmse"] == pytest.approx(np.sqrt((err**2).mean()), rel=1e-4)
    r2 = np.mean(1 - (err**2).sum(0) / ((truth - truth.mean(0)) ** 2).sum(0))
    assert metrics["r2"] == pytest.approx(r2, rel=1e-4)
    huber = np.where(np.abs(err) < 1, 0.5 * err**2, np.abs(err) - 0.5).mean()
    assert metrics["loss"] == pytest.approx(huber, rel=1e-4)

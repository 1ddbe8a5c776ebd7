"""The anomaly output type (Ludwig 0.17's Deep SVDD / Deep SAD, outputs/anomaly.py):
the losses' formulas, the center-distance decoder and its center set before training,
a tiny run that ranks the anomalies above the normal rows with the radius and threshold
fitted after training, and a bad label refused (no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from raylight.declarative.models.anomaly import CenterDistance, DeepSAD, DeepSVDD
from raylight.declarative.outputs import OUTPUTS
from raylight.declarative.suggest import validate_config
from raylight.declarative.train import load_model


def test_deep_svdd_s_hard_and_soft_boundaries():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert float(DeepSVDD(0.0)(scores, torch.zeros(4))) == pytest.approx(4.0)  # the mean score
    radius = float(torch.quantile(scores, 0.75))  # nu 0.25: the 0.75 quantile
    expected = radius + float(torch.clamp(scores - radius, min=0).mean()) / 0.25
    assert float(DeepSVDD(0.25)(scores, torch.zeros(4))) == pytest.approx(expected)


def test_deep_sad_pushes_labelled_anomalies_away():
    scores = torch.tensor([1.0, 4.0], requires_grad=True)
    loss = DeepSAD(2.0)(scores, torch.tensor([0.0, 1.0]))
    assert float(loss.detach()) == pytest.approx((1.0 + 2.0 / (4.0 + 1e-6)) / 2)
    loss.backward()
    assert scores.grad[0] > 0 > scores.grad[1]  # descending: the normal row nearer, the anomaly farther


def test_the_decoder_is_the_squared_distance_from_its_center():
    decoder = CenterDistance(2)
    x = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    torch.testing.assert_close(decoder(x), torch.tensor([[5.0], [9.0]]))
    decoder.start(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(decoder(x), torch.tensor([[4.0], [4.0]]))


def _data(n: int, seed: int) -> pd.DataFrame:
    """Normal rows around 0, one in ten an anomaly around (4, 4, 4), labelled 1."""
    rng = np.random.default_rng(seed)
    anomaly = rng.uniform(size=n) < 0.1
    x = rng.normal(size=(n, 3)) + 4.0 * anomaly[:, None]
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "anomaly": anomaly.astype(int)})


CONFIG = """\
input_features: [{name: a, type: number}, {name: b, type: number}, {name: c, type: number}]
output_features: [{name: anomaly, type: anomaly, loss: {type: deep_svdd, nu: 0.1}}]
combiner: {type: concat, fc_layers: [{output_size: 16}, {output_size: 8}]}
trainer: {epochs: 4, batch_size: 32, learning_rate: 0.001}
preprocessing: {split: {type: random, probabilities: [0.6, 0.1, 0.3]}}
"""


def test_a_tiny_run_ranks_the_anomalies_first_and_keeps_its_radius_and_threshold(tmp_path):
    _data(600, 0).to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "c.yaml").write_text(CONFIG)
    out = api.train(load_config(str(tmp_path / "c.yaml")), str(tmp_path / "d.csv"), output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["roc_auc"] > 0.8, out["evaluation"]["test"]
    model = load_model(str(tmp_path / "run" / "model"))
    center = model.model.decoders["anomaly"].center
    assert center.abs().sum() > 0  # the mean of the combiner's outputs, not Ludwig's zeros
    meta = json.loads((tmp_path / "run" / "model" / "model.json").read_text())["meta"]["anomaly"]
    assert meta["radius"] > 0 and meta["threshold"] > 0
    df = _data(200, 3)
    predicted = model.predict(df)
    assert list(predicted.columns) == ["anomaly_anomaly_score", "anomaly_predictions"]
    scores = predicted["anomaly_anomaly_score"].to_numpy(dtype=float)
    assert (predicted["anomaly_predictions"] == (scores >= meta["threshold"])).all()
    assert scores[df["anomaly"] == 1].mean() > scores[df["anomaly"] == 0].mean()


def test_a_fixed_threshold_is_kept_and_layers_on_the_decoder_are_refused():
    base = {"input_features": [{"name": "a", "type": "number"}]}
    cfg = validate_config({**base, "output_features": [{"name": "y", "type": "anomaly", "threshold": 2.5}]})
    assert OUTPUTS["anomaly"].threshold(cfg.output_features[0], {"threshold": 9.0}) == 2.5
    with pytest.raises(ConfigError, match="distance from the center"):
        validate_config({**base, "output_features": [{"name": "y", "type": "anomaly", "decoder": {"num_fc_layers": 1}}]})
    with pytest.raises(ConfigError, match=r"output_features\.0\.loss\.type"):
        validate_config({**base, "output_features": [{"name": "y", "type": "anomaly", "loss": {"type": "drocc"}}]})


def test_a_value_that_is_no_label_is_refused_naming_the_column(tmp_path):
    df = _data(60, 1).astype({"anomaly": object})
    df.loc[3, "anomaly"] = "maybe"
    df.to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "c.yaml").write_text(CONFIG)
    with pytest.raises(ConfigError, match=r"column 'anomaly' .*type anomaly.* such as \['maybe'\]; write 0 \(normal\)"):
        api.train(load_config(str(tmp_path / "c.yaml")), str(tmp_path / "d.csv"), output_directory=str(tmp_path / "run"), progress=False)

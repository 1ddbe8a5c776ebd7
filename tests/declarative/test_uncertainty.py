"""Ludwig's inference-time settings of a classifier's decoder (models/uncertainty.py):
temperature scaling fitted after training on the validation split, and Monte Carlo
dropout at prediction with <output>_uncertainty; their config keys (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from raylight.declarative.models.uncertainty import ece, fit_temperature, nll
from raylight.declarative.suggest import validate_config
from raylight.declarative.train import load_model
from tests.declarative_data import MULTI, multi, write


def _overconfident(scale: float, rows: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from sigmoid(a), logits scale x a: a model ``scale`` times too sure."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0, 2, rows)
    labels = (rng.uniform(size=rows) < 1 / (1 + np.exp(-a))).astype(np.int64)
    return scale * a, labels


def test_the_fitted_temperature_undoes_overconfidence():
    logits, labels = _overconfident(3.0)
    t = fit_temperature(logits, labels)
    assert 2.6 < t < 3.4
    assert nll(logits, labels, t) < nll(logits, labels) and ece(logits, labels, t) < ece(logits, labels)
    calibrated, same = _overconfident(1.0)
    assert 0.85 < fit_temperature(calibrated, same) < 1.15  # well calibrated already: about 1
    # a category's logits (rows, classes): the same rule
    three = np.stack([np.zeros_like(logits), logits, -logits], axis=1)
    assert fit_temperature(three, labels) > 1.5


def _config(decoder: str, out: str = "y") -> str:
    return MULTI.replace("  - {name: y, type: binary}\n", f"  - {{name: y, type: binary, decoder: {decoder}}}\n").replace(
        "  - {name: k, type: category}\n", f"  - {{name: k, type: category, decoder: {decoder}}}\n"
    )


def test_temperature_scaling_is_fitted_after_training_and_applied_at_prediction(tmp_path):
    decoder = "{type: mlp_classifier, num_fc_layers: 1, output_size: 16, calibration: temperature_scaling}"
    cfg, data = write(tmp_path, df=multi(300), config=_config(decoder).replace("epochs: 15", "epochs: 10"))
    api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(str(tmp_path / "run" / "model"))
    temps = {k: float(v) for k, v in model.model.state_dict().items() if k.endswith("temperature")}
    assert sorted(temps) == ["decoders.k.2.temperature", "decoders.y.2.temperature"]
    assert all(t > 0 and np.isfinite(t) for t in temps.values())
    assert any(abs(t - 1) > 1e-3 for t in temps.values()), temps
    df = multi(50, seed=5)
    with torch.no_grad():
        raw = model.model.decoders["y"][:2](model.model.combined(_batch(model, df)))
    predicted = model.predict(df)
    expected = torch.sigmoid(raw.squeeze(1) / temps["decoders.y.2.temperature"]).numpy()
    np.testing.assert_allclose(predicted["y_probabilities"].to_numpy(dtype=float), expected, rtol=1e-5)


def _batch(model, df) -> dict[str, torch.Tensor]:
    arrays, _ = model._arrays(df, with_outputs=False, source="test")
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def test_mc_dropout_predicts_the_mean_and_writes_the_uncertainty(tmp_path):
    decoder = "{type: mlp_classifier, num_fc_layers: 1, output_size: 16, dropout: 0.3, mc_dropout_samples: 20}"
    cfg, data = write(tmp_path, df=multi(300), config=_config(decoder))
    api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    model = load_model(str(tmp_path / "run" / "model"))
    df = multi(40, seed=5)
    first, again = model.predict(df), model.predict(df)
    assert first.equals(again)  # seeded by trainer.seed: the same predictions each time
    spread = first["y_uncertainty"].to_numpy(dtype=float)
    assert (spread >= 0).all() and spread.max() > 0  # dropout on: the samples differ
    assert (first["y_predictions"] == (first["y_probabilities"] >= 0.5)).all()
    per_class = np.array(first["k_uncertainty"].tolist())
    assert per_class.shape == (40, 3) and (per_class >= 0).all()
    # the mean of the samples: not the one pass without dropout
    with torch.no_grad():
        plain = torch.sigmoid(model.model(_batch(model, df))["y"]).numpy()
    assert not np.allclose(first["y_probabilities"].to_numpy(dtype=float), plain)


@pytest.mark.parametrize(("output", "line"), [
    ("{name: z, type: number, decoder: {mc_dropout_samples: 5}}", "output_features.0.decoder.mc_dropout_samples: Ludwig's"),
    ("{name: z, type: number, decoder: {calibration: temperature_scaling}}", "output_features.0.decoder.calibration: Ludwig's"),
    ("{name: y, type: binary, decoder: {calibration: platt}}", "output_features.0.decoder.calibration: Input should be"),
])
def test_a_setting_of_the_wrong_output_or_value_names_its_key(output, line):
    import yaml

    with pytest.raises(ConfigError) as err:
        validate_config({"input_features": [{"name": "a", "type": "number"}], "output_features": [yaml.safe_load(output)]})
    assert line in str(err.value), str(err.value)


def test_ludwig_s_output_level_calibration_switch_is_temperature_scaling():
    cfg = validate_config({"input_features": [{"name": "a", "type": "number"}],
                           "output_features": [{"name": "y", "type": "binary", "calibration": True},
                                               {"name": "k", "type": "category", "calibration": False}]})
    assert [out.decoder.calibration for out in cfg.output_features] == ["temperature_scaling", None]

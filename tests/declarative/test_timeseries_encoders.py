"""Ludwig's forecasting encoders for timeseries inputs (``nbeats``, ``patchtst``): their
Ludwig sections load at Ludwig's defaults, the modules give one vector per row and train
through their gradients, PatchTST cuts the series into Ludwig's patches, and a tiny
forecast learns (no Ray)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.features.timeseries import NBeatsEncoder
from raylight.declarative.loading import load_config
from raylight.declarative.models.ecd import build_model
from raylight.declarative.models.timeseries_encoders import patches
from raylight.declarative.suggest import validate_config

STEPS = 20


def config(encoder: dict, horizon: int = 3) -> ModelConfig:
    return validate_config({
        "input_features": [{"name": "h", "type": "timeseries", "encoder": encoder}],
        "output_features": [{"name": "f", "type": "timeseries", "horizon": horizon}],
        "combiner": {"type": "concat", "fc_layers": []},
    })


def test_the_sections_load_at_ludwig_s_defaults():
    nbeats = config({"type": "nbeats"}).input_features[0].encoder
    assert (nbeats.num_stacks, nbeats.num_blocks, nbeats.num_layers, nbeats.layer_size, nbeats.output_size, nbeats.dropout) == (2, 3, 4, 256, 256, 0.0)
    tst = config({"type": "patchtst"}).input_features[0].encoder
    assert (tst.patch_size, tst.patch_stride, tst.d_model, tst.num_heads, tst.num_layers, tst.ffn_dim, tst.dropout, tst.output_size,
            tst.reduce_output) == (16, 8, 128, 8, 3, 256, 0.1, 256, "mean")
    assert config({}).input_features[0].encoder.type == "parallel_cnn"  # Ludwig's default stays
    saved = config({"type": "nbeats", "layer_size": 8}).model_dump(mode="json")
    assert saved["input_features"][0]["encoder"]["layer_size"] == 8  # a saved config says it, and loads as it was
    assert ModelConfig.model_validate(saved).input_features[0].encoder == NBeatsEncoder(type="nbeats", layer_size=8)


@pytest.mark.parametrize(("encoder", "line"), [
    ({"type": "patchtst", "d_model": 10, "num_heads": 4}, "input_features.0.encoder: d_model 10 is not a multiple"),
    ({"type": "nbeats", "num_stacks": 0}, "input_features.0.encoder.num_stacks"),
    ({"type": "nbeats", "patch_size": 4}, "input_features.0.encoder.patch_size"),  # another encoder's key, at its path
    ({"type": "nbeat"}, "input_features.0.encoder.type: Input should be 'parallel_cnn', "),  # every type listed, at the type
])
def test_a_bad_setting_names_its_key_path(encoder, line):
    with pytest.raises(ConfigError) as err:
        config(encoder)
    assert line in str(err.value), str(err.value)


@pytest.mark.parametrize("encoder", [
    {"type": "nbeats", "num_stacks": 2, "num_blocks": 2, "num_layers": 2, "layer_size": 16, "output_size": 8, "dropout": 0.1},
    {"type": "patchtst", "patch_size": 4, "patch_stride": 2, "d_model": 8, "num_heads": 2, "num_layers": 2, "ffn_dim": 16, "output_size": 8},
    {"type": "patchtst", "patch_size": 4, "patch_stride": 4, "d_model": 8, "num_heads": 2, "output_size": 8, "reduce_output": "last"},
], ids=["nbeats", "patchtst", "patchtst-last"])
def test_each_encoder_gives_one_vector_per_row_and_trains_through_it(encoder):
    model = build_model(config(encoder), {"h": {"length": STEPS}, "f": {"length": 3}})
    assert model.embeddings["h"].width == 8
    out = model({"h": torch.randn(5, STEPS)})["f"]
    assert out.shape == (5, 3) and torch.isfinite(out).all()
    out.sum().backward()
    grads = [p.grad for p in model.embeddings["h"].parameters()]
    assert grads and all(g is not None for g in grads) and all(g.abs().sum() > 0 for g in grads)  # each used: DDP's rule


def test_patchtst_cuts_ludwig_s_patches_and_pads_a_short_series_to_one():
    assert patches(128, 16, 8) == 15  # Ludwig's example: (128 - 16) // 8 + 1
    enc = {"type": "patchtst", "patch_size": 8, "patch_stride": 4, "d_model": 8, "num_heads": 2, "output_size": 4}
    model = build_model(config(enc), {"h": {"length": 5}, "f": {"length": 3}})
    assert model.embeddings["h"].positions.shape[1] == 1  # one patch: the 5 steps padded to 8
    series = torch.randn(2, 5)
    padded = torch.cat([series, series[:, -1:].expand(-1, 3)], dim=1)
    model.eval()
    torch.testing.assert_close(model.embeddings["h"](series), model.embeddings["h"](padded))


@pytest.mark.parametrize("encoder", [
    "{type: nbeats, num_stacks: 1, num_blocks: 2, num_layers: 2, layer_size: 32, output_size: 16}",
    "{type: patchtst, patch_size: 4, patch_stride: 2, d_model: 16, num_heads: 2, num_layers: 1, ffn_dim: 32, output_size: 16, dropout: 0.0}",
], ids=["nbeats", "patchtst"])
def test_a_tiny_forecast_learns(tmp_path, encoder):
    # each row a sine of its own phase; the target the next 3 values
    rng = np.random.default_rng(0)
    phase = rng.uniform(0, 2 * np.pi, 300)
    steps = np.arange(12 + 3)
    values = np.sin(phase[:, None] + 0.5 * steps[None, :])
    frame = pd.DataFrame({
        "h": [" ".join(f"{v:.4f}" for v in row[:12]) for row in values],
        "f": [" ".join(f"{v:.4f}" for v in row[12:]) for row in values],
    })
    frame.to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "c.yaml").write_text(
        f"input_features:\n  - {{name: h, type: timeseries, encoder: {encoder}}}\n"
        "output_features:\n  - {name: f, type: timeseries, loss: {type: mean_squared_error}}\n"
        "combiner: {type: concat, fc_layers: []}\n"
        "trainer: {epochs: 12, batch_size: 32, learning_rate: 0.003}\n"
    )
    out = api.train(load_config(str(tmp_path / "c.yaml")), str(tmp_path / "d.csv"),
                    output_directory=str(tmp_path / "run"), backend="local", progress=False)
    # a sine's values have variance 0.5: predicting their mean scores mse 0.5
    assert out["evaluation"]["test"]["mse"] < 0.1, out["evaluation"]["test"]

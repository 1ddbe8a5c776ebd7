"""A category output's objectosphere loss (Ludwig's open-set recognition,
models/losses.py): its parts on known and background rows, its gradient, a tiny run in
which the background class's logits come out small, and a background_class that is no
class refused (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.declarative import api
from raylight.declarative.loading import load_config
from raylight.declarative.models.losses import ObjectosphereLoss
from raylight.declarative.train import load_model
from tests.declarative_data import MULTI, multi, write


def test_known_rows_pay_cross_entropy_and_the_hinge_background_rows_entropy_and_norm():
    loss = ObjectosphereLoss(background=2, xi=5.0, zeta=0.1)
    big = torch.tensor([[20.0, 0.0, 0.0]])  # norm 20 >= xi: no hinge; cross-entropy ~ 0
    assert float(loss(big, torch.tensor([0]))) == pytest.approx(float(torch.nn.functional.cross_entropy(big, torch.tensor([0]))))
    small = torch.tensor([[1.0, 0.0, 0.0]])  # norm 1: a hinge of (5 - 1)^2 on top
    assert float(loss(small, torch.tensor([0]))) == pytest.approx(float(torch.nn.functional.cross_entropy(small, torch.tensor([0]))) + 16.0)
    zero = torch.zeros(1, 3)  # a background row at the origin: uniform, -log 3, no norm
    assert float(loss(zero, torch.tensor([2]))) == pytest.approx(-math.log(3), abs=1e-6)
    both = float(loss(torch.cat([big, zero]), torch.tensor([0, 2])))  # each part a mean over its rows, added
    assert both == pytest.approx(float(loss(big, torch.tensor([0]))) + float(loss(zero, torch.tensor([2]))), abs=1e-6)
    # no background class: every row known
    assert float(ObjectosphereLoss(None, 5.0, 0.1)(small, torch.tensor([2]))) > 16.0


def test_a_background_row_s_gradient_shrinks_its_logits():
    logits = torch.tensor([[3.0, -1.0, 2.0]], requires_grad=True)
    ObjectosphereLoss(background=1, xi=10.0, zeta=0.5)(logits, torch.tensor([1])).backward()
    stepped = logits.detach() - 0.1 * logits.grad
    assert stepped.norm() < logits.detach().norm()


def _config(background: int) -> str:
    return MULTI.replace(
        "  - {name: k, type: category}\n",
        f"  - {{name: k, type: category, loss: {{type: objectosphere, background_class: {background}, xi: 5.0, zeta: 0.1}}}}\n",
    ).replace("  - {name: y, type: binary}\n", "").replace("  - {name: z, type: number, loss: {weight: 0.5}}\n", "")


def test_the_background_class_s_logits_come_out_small(tmp_path):
    # k's classes sorted: hi, lo, mid; mid (index 2) is the background
    cfg, data = write(tmp_path, df=multi(400), config=_config(2))
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["evaluation"]["test"]["accuracy"] > 0.6
    model = load_model(str(tmp_path / "run" / "model"))
    df = multi(200, seed=7)
    arrays, _ = model._arrays(df, with_outputs=False, source="test")
    with torch.no_grad():
        norms = model.model({k: torch.from_numpy(v) for k, v in arrays.items()})["k"].norm(dim=1).numpy()
    background = (df["k"] == "mid").to_numpy()
    assert norms[background].mean() < 0.5 * norms[~background].mean(), (norms[background].mean(), norms[~background].mean())


def test_a_background_class_that_is_no_class_is_refused_naming_the_classes(tmp_path):
    cfg, data = write(tmp_path, df=multi(100), config=_config(3))
    with pytest.raises(ConfigError, match=r"loss.background_class 3 is no class: the training split has 3 \(\['hi', 'lo', 'mid'\]"):
        api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written

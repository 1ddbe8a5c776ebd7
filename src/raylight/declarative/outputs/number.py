"""Number outputs: the target standardised by the training split's mean and standard
deviation (the decoder learns the standardised value; predictions and errors are in the
target's own units); mean squared error as the loss."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from raylight.declarative.features import number as number_input
from raylight.declarative.outputs.base import OutputModel, no_target_check, no_target_summary

if TYPE_CHECKING:
    import torch
    from torch import nn

PERCENT_EPS = 1.17e-06  # torchmetrics' MeanAbsolutePercentageError clamps |target| here (Ludwig's mape)


class NumberOutput(OutputModel):
    type: Literal["number"]


Output = NumberOutput
METRICS: tuple[str, ...] = ("loss", "mse", "mae", "r2", "rmse", "mape", "rmspe")
WIDE = False
RANKS = False

check, block_summary, check_blocks = number_input.check, number_input.block_summary, number_input.check_blocks
target_summary, check_target_blocks = no_target_summary, no_target_check


def check_target(col: pd.Series, out: NumberOutput, source: str) -> None:
    return None


def fit(col: pd.Series, out: NumberOutput) -> dict[str, Any]:
    stats = number_input.fit(col.dropna(), out)
    return {"mean": stats["mean"], "std": stats["std"]}


def fit_ray(train: Any, outs: list[NumberOutput]) -> dict[str, dict[str, Any]]:
    fitted = number_input.fit_ray(train, outs)
    return {out.name: {"mean": fitted[out.name]["mean"], "std": fitted[out.name]["std"]} for out in outs}


def transform(col: pd.Series, out: NumberOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    values = pd.to_numeric(col, errors="coerce").fillna(meta["mean"]).to_numpy(dtype=np.float64)
    return ((values - meta["mean"]) / meta["std"]).astype(np.float32), col.notna().to_numpy()


def decoder_size(out: NumberOutput, meta: dict[str, Any]) -> int:
    return 1


def loss(out: NumberOutput) -> nn.Module:
    from torch import nn

    return nn.MSELoss()


def predictions(out: NumberOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return raw, None


def sum_names(out: NumberOutput, meta: dict[str, Any]) -> list[str]:
    return ["sse", "sae", "t", "t2", "ape", "spe"]


def add_sums(sums: dict[str, float], out: NumberOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    """Errors in the target's own units, and the targets' sums (for r2)."""
    std = meta.get("std", 1.0)
    err = ((raw - target) * std).double()
    scaled = (target * std).double()
    sums["sse"] += float(err.pow(2).sum())
    sums["sae"] += float(err.abs().sum())
    sums["t"] += float(scaled.sum())
    sums["t2"] += float(scaled.pow(2).sum())
    # percentage errors: over |target| in its own units, at least torchmetrics' epsilon
    relative = err / (scaled + meta.get("mean", 0.0)).abs().clamp(min=PERCENT_EPS)
    sums["ape"] += float(relative.abs().sum())
    sums["spe"] += float(relative.pow(2).sum())
    return None


def metrics(out: NumberOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    rows = sums["n"] or 1.0
    mse = sums["sse"] / rows
    var = (sums["t2"] / rows - (sums["t"] / rows) ** 2) or 1.0
    return {
        "mse": mse, "mae": sums["sae"] / rows, "r2": 1.0 - mse / var, "rmse": math.sqrt(mse),
        "mape": sums["ape"] / rows, "rmspe": math.sqrt(sums["spe"] / rows),
    }


def predicted(out: NumberOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), None, dtype=object)
    col[keep] = (pred.numpy() * meta["std"] + meta["mean"]).tolist()
    return {f"{out.name}_predictions": col}

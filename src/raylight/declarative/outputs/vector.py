"""Vector outputs: rows of floats of one length (``features.vector``'s parsing, Ludwig's
projector: one linear layer), mean squared error over every float as the loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.declarative.features import vector as vector_input
from raylight.declarative.features.base import MAX_WIDTH
from raylight.declarative.outputs.base import OutputModel, no_target_check, no_target_summary

if TYPE_CHECKING:
    import torch
    from torch import nn


class VectorOutput(OutputModel):
    type: Literal["vector"]
    vector_size: int | None = Field(
        None, ge=1, le=MAX_WIDTH,
        description="vector: the floats in each row (Ludwig's); null: the length the training rows share.",
    )


Output = VectorOutput
METRICS: tuple[str, ...] = ("loss", "mse", "mae", "r2")
WIDE = True
RANKS = False

check, block_summary, check_blocks = vector_input.check, vector_input.block_summary, vector_input.check_blocks
fit, fit_ray = vector_input.fit, vector_input.fit_ray
target_summary, check_target_blocks = no_target_summary, no_target_check


def check_target(col: pd.Series, out: VectorOutput, source: str) -> None:
    return None


def transform(col: pd.Series, out: VectorOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    array, kept = vector_input.transform(col, out, meta)
    keep = col.notna().to_numpy()
    return array, keep & kept if kept is not None else keep


def decoder_size(out: VectorOutput, meta: dict[str, Any]) -> int:
    return int(meta["size"])


def loss(out: VectorOutput) -> nn.Module:
    from torch import nn

    return nn.MSELoss()  # Ludwig's mean_squared_error: over every float of every row


def predictions(out: VectorOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return raw, None


def sum_names(out: VectorOutput, meta: dict[str, Any]) -> list[str]:
    return ["sse", "sae", *(f"{k}.{j}" for j in range(int(meta["size"])) for k in ("sse", "t", "t2"))]


def add_sums(sums: dict[str, float], out: VectorOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    """Errors over every float; and per column, for each one's r2."""
    err, value = (raw - target).double(), target.double()
    sums["sse"] += float(err.pow(2).sum())
    sums["sae"] += float(err.abs().sum())
    for j, (e2, t, t2) in enumerate(zip(err.pow(2).sum(0), value.sum(0), value.pow(2).sum(0), strict=True)):
        sums[f"sse.{j}"] += float(e2)
        sums[f"t.{j}"] += float(t)
        sums[f"t2.{j}"] += float(t2)
    return None


def metrics(out: VectorOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    """mse and mae over all the floats, r2 the mean of the columns' (Ludwig's, torchmetrics'
    uniform average)."""
    rows = sums["n"] or 1.0
    size = sum(1 for k in sums if k.startswith("sse."))
    r2 = [
        1.0 - (sums[f"sse.{j}"] / rows) / ((sums[f"t2.{j}"] / rows - (sums[f"t.{j}"] / rows) ** 2) or 1.0)
        for j in range(size)
    ]
    return {"mse": sums["sse"] / (rows * size), "mae": sums["sae"] / (rows * size), "r2": float(np.mean(r2))}


def predicted(out: VectorOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), None, dtype=object)
    for i, row in zip(np.flatnonzero(keep), pred.numpy(), strict=True):
        col[i] = row.tolist()
    return {f"{out.name}_predictions": col}

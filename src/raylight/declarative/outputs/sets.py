"""Set outputs (multi-label classification): each row's labels (``features.sets``' tokens,
Ludwig's output preprocessing) as a multi-hot row; a logistic decoder per label,
predicting each at ``threshold`` and above; Ludwig's jaccard."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from raylight.declarative.features import sets as set_input
from raylight.declarative.features.base import present
from raylight.declarative.outputs.base import (
    OutputModel,
    Threshold,
    no_target_check,
    no_target_summary,
)
from raylight.declarative.outputs.category import probabilities

if TYPE_CHECKING:
    import torch
    from torch import nn


class SetOutput(OutputModel):
    type: Literal["set"]
    threshold: Threshold = 0.5


Output = SetOutput
METRICS: tuple[str, ...] = ("loss", "jaccard")
WIDE = True
RANKS = False

check, block_summary, check_blocks = set_input.check, set_input.block_summary, set_input.check_blocks
target_summary, check_target_blocks = no_target_summary, no_target_check


def check_target(col: pd.Series, out: SetOutput, source: str) -> None:
    return None


def fit(col: pd.Series, out: SetOutput) -> dict[str, Any]:
    return set_input.fit_target(col, out)


def fit_ray(train: Any, outs: list[SetOutput]) -> dict[str, dict[str, Any]]:
    return {out.name: set_input.fit_target_ray(train, out) for out in outs}


def transform(col: pd.Series, out: SetOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    return set_input.target_array(col, meta["classes"]), present(col)  # "" has no labels either


def decoder_size(out: SetOutput, meta: dict[str, Any]) -> int:
    return len(meta["classes"])


def loss(out: SetOutput) -> nn.Module:
    from torch import nn

    return nn.BCEWithLogitsLoss()


def predictions(out: SetOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    prob = torch.sigmoid(raw)
    return (prob >= out.threshold).long(), prob


def sum_names(out: SetOutput, meta: dict[str, Any]) -> list[str]:
    return ["jaccard"]


def add_sums(sums: dict[str, float], out: SetOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    """Ludwig's jaccard: |predicted & true| / |predicted | true| per row."""
    import torch

    pred, _ = predictions(out, raw)
    both, either = (pred.bool() & target.bool()).sum(1), (pred.bool() | target.bool()).sum(1)
    sums["jaccard"] += float(torch.where(either > 0, both / either.clamp(min=1), 1.0).sum())
    return None


def metrics(out: SetOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    return {"jaccard": sums["jaccard"] / (sums["n"] or 1.0)}


def predicted(out: SetOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), None, dtype=object)
    for i, row in zip(np.flatnonzero(keep), pred.numpy(), strict=True):  # one list per row (not a 2-D array)
        col[i] = [meta["classes"][j] for j in np.flatnonzero(row)]
    return {f"{out.name}_predictions": col, **probabilities(out, prob, meta, keep)}

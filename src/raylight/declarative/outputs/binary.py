"""Binary outputs: a true-like value (``features.binary``'s) is 1, anything else 0; a
logistic decoder, predicting true at ``threshold`` and above."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from raylight.declarative.features import binary as binary_input
from raylight.declarative.outputs.base import (
    OutputModel,
    Threshold,
    block_classes,
    check_classes,
    first_classes,
)

if TYPE_CHECKING:
    import torch
    from torch import nn


class BinaryOutput(OutputModel):
    type: Literal["binary"]
    threshold: Threshold = 0.5


Output = BinaryOutput
METRICS: tuple[str, ...] = ("loss", "accuracy", "roc_auc", "precision", "recall", "specificity")
WIDE = False
RANKS = True  # roc_auc ranks every row's score

check, block_summary, check_blocks = binary_input.check, binary_input.block_summary, binary_input.check_blocks
target_summary = first_classes


def check_target(col: pd.Series, out: BinaryOutput, source: str) -> None:
    check_classes(out, col.dropna().unique().tolist(), source, most=2)


def check_target_blocks(summary: pd.DataFrame, out: BinaryOutput, source: str) -> None:
    classes = block_classes(summary)
    check_classes(out, classes, source, most=2)
    check(pd.Series(classes, dtype=object), out, "output_features")


def fit(col: pd.Series, out: BinaryOutput) -> dict[str, Any]:
    return {}


def fit_ray(train: Any, outs: list[BinaryOutput]) -> dict[str, dict[str, Any]]:
    return {out.name: {} for out in outs}


def transform(col: pd.Series, out: BinaryOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    return binary_input.to_float(col).fillna(0.0).to_numpy(dtype=np.float32), col.notna().to_numpy()


def decoder_size(out: BinaryOutput, meta: dict[str, Any]) -> int:
    return 1


def loss(out: BinaryOutput) -> nn.Module:
    from torch import nn

    return nn.BCEWithLogitsLoss()


def predictions(out: BinaryOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    prob = torch.sigmoid(raw)
    return (prob >= out.threshold).long(), prob


def sum_names(out: BinaryOutput, meta: dict[str, Any]) -> list[str]:
    return ["correct", "tp", "fp", "fn", "tn"]


def add_sums(sums: dict[str, float], out: BinaryOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> np.ndarray:
    """The correct predictions and the confusion counts at the threshold."""
    import torch

    pred, _ = predictions(out, raw)
    truth = target.long()
    sums["correct"] += float((pred == truth).sum())
    sums["tp"] += float(((pred == 1) & (truth == 1)).sum())
    sums["fp"] += float(((pred == 1) & (truth == 0)).sum())
    sums["fn"] += float(((pred == 0) & (truth == 1)).sum())
    sums["tn"] += float(((pred == 0) & (truth == 0)).sum())
    return torch.stack([raw.double(), target.double()], dim=1).numpy()


def metrics(out: BinaryOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    """Precision, recall and specificity at the threshold; 0 where undefined (torchmetrics')."""
    assert scored is not None
    rows = sums["n"] or 1.0
    tp, fp, fn, tn = (sums[k] for k in ("tp", "fp", "fn", "tn"))
    return {
        "accuracy": sums["correct"] / rows, "roc_auc": roc_auc(scored[:, 0], scored[:, 1]),
        "precision": tp / (tp + fp) if tp + fp else 0.0, "recall": tp / (tp + fn) if tp + fn else 0.0,
        "specificity": tn / (tn + fp) if tn + fp else 0.0,
    }


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for the ``labels`` (1 positive): the
    chance a positive scores above a negative, ties counting half (Mann-Whitney's U over
    the counts of both); 0.5 where either class is absent (undefined)."""
    from scipy.stats import rankdata

    positive = labels == 1
    pos, neg = int(positive.sum()), int((~positive).sum())
    if pos == 0 or neg == 0:
        return 0.5
    ranks = rankdata(scores)  # ties: their average rank
    return float((ranks[positive].sum() - pos * (pos + 1) / 2) / (pos * neg))


def predicted(out: BinaryOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), None, dtype=object)
    col[keep] = [bool(v) for v in pred.tolist()]
    columns: dict[str, Any] = {f"{out.name}_predictions": col}
    if prob is not None:
        probs = np.full(len(keep), np.nan)
        probs[keep] = prob.numpy()
        columns[f"{out.name}_probabilities"] = probs
    return columns

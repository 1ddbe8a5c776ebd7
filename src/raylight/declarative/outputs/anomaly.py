"""Anomaly outputs (Ludwig 0.17's ``anomaly`` type, Deep One-Class Classification): the
decoder is the squared distance of the combiner's output from a center c, the
*anomaly score* (Ludwig's AnomalyDecoder; ``models/anomaly.py``). c is the mean of the
combiner's outputs over the training split before the first step (Ruff et al.'s Deep
SVDD; Ludwig 0.17 documents it after the first epoch and never sets it, leaving 0), a
buffer saved with the weights.

The target is a label per row: 0 normal, 1 anomaly, empty (or -1) unlabeled, Ludwig's.
The loss: ``deep_svdd`` (default): with ``nu`` > 0 the soft boundary, R + mean(max(0,
score - R)) / nu, R the batch scores' (1 - nu) quantile (no gradient through it); with
``nu: 0`` the mean score (every row pulled to c); labels unused. ``deep_sad``: normal and
unlabeled rows' score, labelled anomalies' eta / score (pushed away), averaged.

After training (Ludwig's): the radius R is the training split's (1 - nu) quantile of the
scores, and with ``threshold: auto`` the threshold is the ``threshold_percentile``-th
percentile of the validation split's scores (the training split's without one); both are
kept with the model's metadata. Predictions: ``<name>_anomaly_score`` and
``<name>_predictions``, true where the score reaches the threshold. Metrics: the loss and
roc_auc of the scores on the labelled rows (0.5 without both labels)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import bad_cells, bad_summary, examples
from raylight.declarative.outputs.base import OutputModel, no_target_check, no_target_summary
from raylight.declarative.outputs.binary import roc_auc

if TYPE_CHECKING:
    import torch
    from torch import nn


class AnomalyLoss(ConfigModel):
    type: Literal["deep_svdd", "deep_sad"] = Field("deep_svdd", description="deep_svdd (Ludwig's default) or deep_sad.")
    nu: float = Field(
        0.1, ge=0, lt=1,
        description="deep_svdd: the share of rows allowed outside the radius (soft boundary); 0: every row pulled to the center.",
    )
    eta: float = Field(1.0, ge=0, le=1e6, description="deep_sad: the weight of a labelled anomaly's inverse score.")


class AnomalyOutput(OutputModel):
    type: Literal["anomaly"]
    threshold: float | Literal["auto"] = Field(
        "auto",
        description="anomaly: a score at or above it predicts an anomaly; auto (Ludwig's): the threshold_percentile-th "
        "percentile of the validation split's scores after training.",
    )
    threshold_percentile: float = Field(95.0, ge=0, le=100, description="anomaly: threshold auto's percentile.")
    loss: AnomalyLoss = Field(default_factory=lambda: AnomalyLoss(), description="anomaly: the loss.")

    @model_validator(mode="after")
    def _no_layers(self) -> AnomalyOutput:
        if self.decoder.fc_layers:
            raise ValueError(
                "decoder: an anomaly output's decoder is the distance from the center (Ludwig's anomaly decoder), "
                "without layers; give the combiner the layers (combiner.fc_layers) and remove the decoder's"
            )
        return self


Output = AnomalyOutput
METRICS: tuple[str, ...] = ("loss", "roc_auc")
WIDE = False
RANKS = True  # roc_auc ranks every labelled row's score
_LABELS = frozenset({0.0, 1.0, -1.0})


def labels(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Each row's label (0, 1, or -1 for an empty cell or -1), and the rows that are none of those."""
    def one(v: Any) -> float:
        if pd.isna(v):
            return -1.0
        if isinstance(v, bool | np.bool_):
            return float(v)
        try:
            return float(str(v).strip())
        except ValueError:
            return np.nan

    values = col.map(one).to_numpy(dtype=np.float64)
    return values, ~np.isin(values, list(_LABELS))


def _not_labels(kind: str, out: Any, shown: list[str]) -> ConfigError:
    return ConfigError(
        f"column {out.col!r} ({kind} {out.name!r}, type anomaly) holds values that are no anomaly labels, such as "
        f"{shown}; write 0 (normal), 1 (anomaly) or leave the cell empty (unlabelled)"
    )


def check(col: pd.Series, out: Any, kind: str) -> None:
    _, bad = labels(col)
    if bad.any():
        raise _not_labels(kind, out, bad_cells(col, bad)[0])


def block_summary(col: pd.Series, out: Any) -> dict[str, Any]:
    return bad_summary(col, labels(col)[1])


def check_blocks(summary: pd.DataFrame, out: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise _not_labels(kind, out, examples(summary))


target_summary, check_target_blocks = no_target_summary, no_target_check


def check_target(col: pd.Series, out: AnomalyOutput, source: str) -> None:
    return None  # unlabelled rows are learnt from too (one-class)


def fit(col: pd.Series, out: AnomalyOutput) -> dict[str, Any]:
    return {}


def fit_ray(train: Any, outs: list[AnomalyOutput]) -> dict[str, dict[str, Any]]:
    return {out.name: {} for out in outs}


def transform(col: pd.Series, out: AnomalyOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    values, bad = labels(col)
    if bad.any():  # a dataset to evaluate on
        raise _not_labels("output_features", out, bad_cells(col, bad)[0])
    return values.astype(np.float32), np.ones(len(col), dtype=bool)


def decoder_size(out: AnomalyOutput, meta: dict[str, Any]) -> int:
    return 1


def decoder(out: AnomalyOutput, width: int) -> nn.Module:
    """The center distance (the output's own decoder, in place of a linear layer)."""
    from raylight.declarative.models.anomaly import CenterDistance

    return CenterDistance(width)


def loss(out: AnomalyOutput) -> nn.Module:
    from raylight.declarative.models.anomaly import DeepSAD, DeepSVDD

    return DeepSVDD(out.loss.nu) if out.loss.type == "deep_svdd" else DeepSAD(out.loss.eta)


def predictions(out: AnomalyOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return raw, None  # the score; predicted() applies the fitted threshold


def sum_names(out: AnomalyOutput, meta: dict[str, Any]) -> list[str]:
    return []


def add_sums(sums: dict[str, float], out: AnomalyOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> np.ndarray:
    import torch

    labelled = target >= 0
    return torch.stack([raw[labelled].double(), target[labelled].double()], dim=1).numpy()


def metrics(out: AnomalyOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    assert scored is not None
    return {"roc_auc": roc_auc(scored[:, 0], scored[:, 1])}


def threshold(out: AnomalyOutput, meta: dict[str, Any]) -> float:
    return float(out.threshold) if out.threshold != "auto" else float(meta.get("threshold", np.inf))


def after_training(out: AnomalyOutput, train_scores: np.ndarray, validation_scores: np.ndarray | None) -> dict[str, Any]:
    """Ludwig's after-training values: the radius (the training scores' 1 - nu quantile;
    0 with nu 0) and threshold auto's percentile of the validation scores (the training
    scores' without a validation split)."""
    radius = float(np.quantile(train_scores, 1 - out.loss.nu)) if out.loss.nu > 0 and len(train_scores) else 0.0
    fitted: dict[str, Any] = {"radius": max(radius, 0.0)}
    if out.threshold == "auto":
        scores = validation_scores if validation_scores is not None and len(validation_scores) else train_scores
        fitted["threshold"] = float(np.percentile(scores, out.threshold_percentile)) if len(scores) else float("inf")
    return fitted


def predicted(out: AnomalyOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    scores = np.full(len(keep), np.nan)
    scores[keep] = pred.double().numpy()
    flags = np.full(len(keep), None, dtype=object)
    flags[keep] = [bool(s >= threshold(out, meta)) for s in scores[keep]]
    return {f"{out.name}_anomaly_score": scores, f"{out.name}_predictions": flags}

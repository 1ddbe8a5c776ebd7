"""Category outputs: the target's distinct values (as text) are its classes; a softmax
decoder, predicting the most likely class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features import category as category_input
from raylight.declarative.features.base import MAX_WIDTH
from raylight.declarative.outputs.base import (
    OutputModel,
    block_classes,
    check_classes,
    first_classes,
)

if TYPE_CHECKING:
    import torch
    from torch import nn


class CategoryLoss(ConfigModel):
    type: Literal["softmax_cross_entropy", "objectosphere"] = Field(
        "softmax_cross_entropy",
        description="softmax_cross_entropy (Ludwig's default) or objectosphere (open-set recognition: known classes' "
        "logits pushed to a norm of at least xi, the background class's to uniform and small; models/losses.py).",
    )
    background_class: int | None = Field(
        None, ge=0, le=2**31,
        description="objectosphere: the index of the background (unknown) class among the output's classes, which "
        "raylight sorts (Ludwig counts its <UNK> as 0 and orders by frequency); null: every class is known.",
    )
    xi: float = Field(10.0, ge=0, le=1e6, description="objectosphere: the least logit norm of a known class's row.")
    zeta: float = Field(0.1, ge=0, le=1e6, description="objectosphere: the weight of a background row's squared logit norm.")


class CategoryOutput(OutputModel):
    type: Literal["category"]
    top_k: int = Field(
        3, ge=1, le=MAX_WIDTH,
        description="category: hits_at_k counts a row right when its class is among the k most likely (Ludwig's).",
    )
    loss: CategoryLoss = Field(default_factory=lambda: CategoryLoss(), description="category: the loss.")


Output = CategoryOutput
METRICS: tuple[str, ...] = ("loss", "accuracy", "hits_at_k")
WIDE = True
RANKS = False

check, block_summary, check_blocks = category_input.check, category_input.block_summary, category_input.check_blocks
target_summary = first_classes


def check_target(col: pd.Series, out: CategoryOutput, source: str) -> None:
    check_classes(out, col.dropna().unique().tolist(), source)


def check_target_blocks(summary: pd.DataFrame, out: CategoryOutput, source: str) -> None:
    check_classes(out, block_classes(summary), source)


def fit(col: pd.Series, out: CategoryOutput) -> dict[str, Any]:
    return _checked(out, sorted(col.dropna().astype(str).unique().tolist()))


def fit_ray(train: Any, outs: list[CategoryOutput]) -> dict[str, dict[str, Any]]:
    return {out.name: _checked(out, _classes(train, out.col)) for out in outs}


def _checked(out: CategoryOutput, classes: list[str]) -> dict[str, Any]:
    """The classes, where the loss's background class is one of them."""
    background = out.loss.background_class
    if out.loss.type == "objectosphere" and background is not None and background >= len(classes):
        raise ConfigError(
            f"output_features {out.name!r}: loss.background_class {background} is no class: the training split has "
            f"{len(classes)} ({classes[:10]}, sorted); give the index of the background class among them (from 0)"
        )
    return {"classes": classes}


def _classes(train: Any, col: str) -> list[str]:
    """A classifier target's distinct values in the split, as strings, sorted: one task
    per block (``Dataset.unique`` would run a hash shuffle)."""

    def distinct(df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"value": df[col].dropna().astype(str).unique()})

    values = train.map_batches(distinct, batch_format="pandas", batch_size=None).to_pandas()["value"]
    return sorted(set(values))


def transform(col: pd.Series, out: CategoryOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    index = {v: i for i, v in enumerate(meta["classes"])}
    return np.array([index.get(str(v), 0) for v in col.fillna("")], dtype=np.int64), col.notna().to_numpy()


def decoder_size(out: CategoryOutput, meta: dict[str, Any]) -> int:
    return len(meta["classes"])


def loss(out: CategoryOutput) -> nn.Module:
    from torch import nn

    if out.loss.type == "objectosphere":
        from raylight.declarative.models.losses import ObjectosphereLoss

        return ObjectosphereLoss(out.loss.background_class, out.loss.xi, out.loss.zeta)
    return nn.CrossEntropyLoss()


def predictions(out: CategoryOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    prob = torch.softmax(raw, dim=1)
    return prob.argmax(1), prob


def sum_names(out: CategoryOutput, meta: dict[str, Any]) -> list[str]:
    return ["correct", "hits"]


def add_sums(sums: dict[str, float], out: CategoryOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    pred, _ = predictions(out, raw)
    truth = target.long()
    sums["correct"] += float((pred == truth).sum())
    top = raw.topk(min(out.top_k, raw.shape[1]), dim=1).indices  # the class among the top_k most likely
    sums["hits"] += float((top == truth[:, None]).any(1).sum())
    return None


def metrics(out: CategoryOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    rows = sums["n"] or 1.0
    measured = {"accuracy": sums["correct"] / rows, "hits_at_k": sums["hits"] / rows}
    if len(meta["classes"]) <= out.top_k:
        del measured["hits_at_k"]  # every row's class is among the top k (Ludwig measures it only with more classes)
    return measured


def predicted(out: CategoryOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), None, dtype=object)
    col[keep] = [meta["classes"][i] for i in pred.tolist()]
    return {f"{out.name}_predictions": col, **probabilities(out, prob, meta, keep)}


def probabilities(out: Any, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """A column of each class's (label's) probability, ``<name>_probability_<class>``."""
    columns: dict[str, Any] = {}
    for j, cls in enumerate(meta["classes"] if prob is not None else ()):
        assert prob is not None
        probs = np.full(len(keep), np.nan)
        probs[keep] = prob[:, j].numpy()
        columns[f"{out.name}_probability_{cls}"] = probs
    return columns

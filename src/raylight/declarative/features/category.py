"""Category features: a vocabulary of the training split's most common values (the rest
map to <UNK>), encoded by an embedding. The type init-config gives what no other claims."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    FILL_WITH_MODE,
    MAX_VOCAB,
    UNK,
    EmbeddingEncoder,
    FeatureModel,
    fills_with_mode,
    mode,
)

if TYPE_CHECKING:
    from torch import nn


class CategoryPreprocessing(ConfigModel):
    most_common: int = Field(10_000, ge=1, le=MAX_VOCAB, description="Largest vocabulary kept; the rest map to <UNK>.")
    min_frequency: int = Field(1, ge=1, le=2**31, description="Values seen fewer times map to <UNK>.")
    missing_value_strategy: Literal["fill_with_const", "fill_with_mode", "drop_row"] = Field(
        "fill_with_const", description="What replaces a missing value: fill_value, the training split's most common value, or the row dropped."
    )
    fill_value: str = Field("<UNK>", description="The value used by fill_with_const.")


class CategoryEncoder(EmbeddingEncoder):
    type: Literal["dense", "sparse", "onehot"] = Field(
        "dense",
        description="dense: a trained embedding of embedding_size; sparse or onehot (Ludwig's two names of it): a "
        "one-hot vector of the vocabulary's size, not trained (embedding_size is not read).",
    )


class CategoryInput(FeatureModel):
    type: Literal["category"]
    preprocessing: CategoryPreprocessing = Field(default_factory=lambda: CategoryPreprocessing(), description="Category preprocessing.")
    encoder: CategoryEncoder = Field(default_factory=lambda: CategoryEncoder(), description="Embedding encoder.")


Input = CategoryInput
INFER_RANK = 100  # last: numbers with few values, short strings


def infers(values: pd.Series) -> bool:
    return True


def check(col: pd.Series, feat: Any, kind: str) -> None:
    return None  # any value is a category


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    return {}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    return None


def fit(col: pd.Series, feat: CategoryInput) -> dict[str, Any]:
    cp = feat.preprocessing
    counts = Counter(col.dropna().astype(str))
    kept = [v for v, c in counts.most_common(cp.most_common) if c >= cp.min_frequency]
    return _with_mode({"vocab": [UNK, *kept]}, counts, feat)


def _with_mode(meta: dict[str, Any], counts: Counter[str], feat: Any) -> dict[str, Any]:
    """``meta`` and, where the feature fills with its mode, the training split's most common value."""
    if fills_with_mode(feat):
        meta["mode"] = mode(pd.Series(counts, dtype="int64"), feat)
    return meta


def fit_ray(train: Any, feats: list[CategoryInput]) -> dict[str, dict[str, Any]]:
    """One pass over the split for all the columns: each block's value counts (one task
    per block, no shuffle), summed here; the vocabulary as ``fit`` makes it."""
    cols = sorted({f.col for f in feats})

    def counts(df: pd.DataFrame) -> pd.DataFrame:
        parts = [
            pd.DataFrame({"col": c, "value": vc.index.astype(str), "n": vc.to_numpy()})
            for c in cols
            for vc in [df[c].dropna().value_counts()]
        ]
        return pd.concat(parts, ignore_index=True)

    table = train.map_batches(counts, batch_format="pandas", batch_size=None).to_pandas()
    meta: dict[str, dict[str, Any]] = {}
    for feat in feats:
        cp = feat.preprocessing
        totals = Counter(dict(table[table["col"] == feat.col].groupby("value")["n"].sum()))
        kept = [v for v, c in totals.most_common(cp.most_common) if c >= cp.min_frequency]
        meta[feat.name] = _with_mode({"vocab": [UNK, *kept]}, totals, feat)
    return meta


def transform(col: pd.Series, feat: CategoryInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    cp = feat.preprocessing
    keep = col.notna().to_numpy() if cp.missing_value_strategy == "drop_row" else None
    index = {v: i for i, v in enumerate(meta["vocab"])}
    fill = meta["mode"] if cp.missing_value_strategy == FILL_WITH_MODE else cp.fill_value
    values = col.astype(object).where(col.notna(), fill).astype(str)
    return np.array([index.get(v, 0) for v in values], dtype=np.int64), keep


def encoder(feat: CategoryInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    if getattr(feat.encoder, "type", "dense") in ("sparse", "onehot"):
        from raylight.declarative.models.encoders import OneHot

        return OneHot(len(meta["vocab"])), len(meta["vocab"])
    size = feat.encoder.embedding_size
    return nn.Embedding(len(meta["vocab"]), size), size

"""Binary features: true-like values (1, true, yes, y, t, on) are 1, anything else 0;
the encoder passes them through. ``to_float`` serves a binary target too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    FILL_WITH_MODE,
    FeatureModel,
    fills_with_mode,
    mode,
    modes_ray,
)

if TYPE_CHECKING:
    from torch import nn

TRUTHY = frozenset({"1", "true", "yes", "y", "t", "on", "1.0"})


class BinaryPreprocessing(ConfigModel):
    missing_value_strategy: Literal["fill_with_false", "fill_with_true", "fill_with_mode", "drop_row"] = Field(
        "fill_with_false",
        description="What replaces a missing value: false, true, the training split's more common value (false on a tie), or the row dropped.",
    )


class BinaryInput(FeatureModel):
    type: Literal["binary"]
    preprocessing: BinaryPreprocessing = Field(default_factory=lambda: BinaryPreprocessing(), description="Binary preprocessing.")


Input = BinaryInput
INFER_RANK = 0  # first: any column of at most two values


def infers(values: pd.Series) -> bool:
    return bool(values.nunique() <= 2)


def to_float(col: pd.Series) -> pd.Series:
    """1.0 and 0.0, NaN where the value is missing."""
    if col.dtype == bool:
        return col.astype(float)
    return col.map(lambda v: np.nan if pd.isna(v) else float(str(v).strip().lower() in TRUTHY))


def check(col: pd.Series, feat: Any, kind: str) -> None:
    return None  # any value is true-like or not


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    return {}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    return None


def fit(col: pd.Series, feat: BinaryInput) -> dict[str, Any]:
    if not fills_with_mode(feat):
        return {}
    return {"mode": float(mode(to_float(col).dropna().value_counts(), feat))}


def fit_ray(train: Any, feats: list[BinaryInput]) -> dict[str, dict[str, Any]]:
    modes = modes_ray(train, feats, to_float)
    return {feat.name: {"mode": float(modes[feat.name])} if feat.name in modes else {} for feat in feats}


def transform(col: pd.Series, feat: BinaryInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    values, strategy = to_float(col), feat.preprocessing.missing_value_strategy
    keep = values.notna().to_numpy() if strategy == "drop_row" else None
    fill = {"fill_with_true": 1.0, FILL_WITH_MODE: meta.get("mode")}.get(strategy, 0.0)
    return values.fillna(fill).to_numpy(dtype=np.float32)[:, None], keep


def encoder(feat: BinaryInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    return nn.Identity(), 1

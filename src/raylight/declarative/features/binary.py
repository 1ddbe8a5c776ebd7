"""Binary features: true-like values (1, true, yes, y, t, on) are 1, anything else 0 (a column
whose two values would both be 0 is refused: it is a category);
the encoder passes them through. ``to_float`` serves a binary target too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.base.exceptions import ConfigError
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
INFER_RANK = 0  # first: any column of at most two values that read as true and false


def _merged(values: pd.Series) -> list[str]:
    """The distinct values of a column when the true/false reading makes them one (benign and
    malignant are both false; 3 and 5 too); empty when it keeps them apart."""
    distinct = values.dropna().unique()
    if len(distinct) < 2 or values.dtype == bool or len(set(to_float(pd.Series(distinct, dtype=object)))) == len(distinct):
        return []
    return sorted(str(v) for v in distinct)


def infers(values: pd.Series) -> bool:
    """At most two values that the true/false reading keeps apart (a column of two other
    words, benign and malignant, is a category: as binary both would be false)."""
    return bool(values.nunique() <= 2) and not _merged(values)


def to_float(col: pd.Series) -> pd.Series:
    """1.0 and 0.0, NaN where the value is missing."""
    if col.dtype == bool:
        return col.astype(float)
    return col.map(lambda v: np.nan if pd.isna(v) else float(str(v).strip().lower() in TRUTHY))


def check(col: pd.Series, feat: Any, kind: str) -> None:
    """Refuses a column whose values the true/false reading makes one (two labels, none
    true-like): every row would be false, and the feature (or the target) would say nothing."""
    merged = _merged(col)
    if merged and (kind == "input_features" or len(merged) == 2):  # a target's 3 classes: check_target says so
        shown = ", ".join(repr(v) for v in merged[:5]) + (", ..." if len(merged) > 5 else "")
        raise ConfigError(
            f"{kind}: {feat.name!r} is type binary, but its values ({shown}) all read as false (true is "
            f"one of {', '.join(sorted(TRUTHY))}): every row would be false. Use type: category for a "
            f"column of labels"
        )


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

"""Number features: numeric, finite values, scaled by the training split's mean and
standard deviation (or range); the encoder passes them through.

The checks and statistics serve a number target too (``preprocess``, ``ray_data``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    FILL_WITH_MODE,
    FeatureModel,
    bad_summary,
    examples,
    fills_with_mode,
    mode,
    modes_ray,
    present,
)

if TYPE_CHECKING:
    from torch import nn


class NumberPreprocessing(ConfigModel):
    normalization: Literal["zscore", "minmax", "none"] = Field(
        "zscore", description="How values are scaled (null, Ludwig's spelling of none, is none)."
    )
    missing_value_strategy: Literal["fill_with_mean", "fill_with_mode", "fill_with_const", "drop_row"] = Field(
        "fill_with_mean",
        description="What replaces a missing value: the training split's mean or most common value, fill_value, or the row dropped.",
    )
    fill_value: float = Field(0.0, description="The value used by fill_with_const.")
    outlier_strategy: Literal["fill_with_mean", "fill_with_const", "drop_row"] | None = Field(
        None,
        description="What replaces an outlier (a value more than outlier_threshold standard deviations "
        "from the training split's mean; Ludwig's): its mean, fill_value, or the row dropped; null: kept.",
    )
    outlier_threshold: float = Field(3.0, gt=0, le=1e6, description="outlier_strategy: the distance, in standard deviations.")

    @field_validator("normalization", mode="before")
    @classmethod
    def _null_is_none(cls, value: Any) -> Any:
        return "none" if value is None else value


class NumberInput(FeatureModel):
    type: Literal["number"]
    preprocessing: NumberPreprocessing = Field(default_factory=lambda: NumberPreprocessing(), description="Number preprocessing.")


Input = NumberInput
INFER_RANK = 1  # after binary: a numeric column of two values is binary


def infers(values: pd.Series) -> bool:
    return bool(pd.api.types.is_numeric_dtype(values) and values.nunique() > 20)


# The data errors, one wording for the pandas and the Ray Data checks alike.
def non_numeric(kind: str, feat: Any, examples: list[str], where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type number) holds non-numeric values "
        f"such as {examples}{where}; clean the column or declare the feature as category"
    )


def non_finite(kind: str, feat: Any, where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type number) holds infinite values{where}; "
        "replace them with finite numbers, or leave the cells empty to treat them as missing"
    )


def no_statistics(feat: Any, what: str) -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} (feature {feat.name!r}) has no finite values in the training "
        f"split, so its {what} cannot be computed; fill the column or drop the feature"
    )


# The largest magnitude training computes with (float32); a column beyond it, unscaled, overflows.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def too_large(feat: Any, low: float, high: float, what: str) -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} (feature {feat.name!r}, type number) holds values too large to train on "
        f"(from {low:.3g} to {high:.3g}): {what}; rescale the column (e.g. divide it by a power of ten) "
        "or declare it in other units"
    )


def finite_stats(feat: Any, mean: float, std: float, low: float, high: float) -> dict[str, float]:
    """A number feature's statistics, checked finite; a constant column scales by 1. Finite
    values so large that their mean, spread or range overflow are named, not scaled by 1."""
    if not (np.isfinite(low) and np.isfinite(high)):
        raise no_statistics(feat, "mean and range")
    for name, value in (("mean", mean), ("standard deviation", std), ("range", high - low)):
        if not np.isfinite(value):
            raise too_large(feat, low, high, f"their {name} overflows float64")
    std = std if std > 0 else 1.0
    span = high - low if high > low else 1.0
    return {"mean": float(mean), "std": float(std), "min": float(low), "span": float(span)}


def check_unscaled(feat: Any, low: float, high: float) -> None:
    """An input left unscaled (normalization none) is trained on in float32, as it is."""
    prep = getattr(feat, "preprocessing", None)
    if getattr(prep, "normalization", None) == "none" and max(abs(low), abs(high)) > FLOAT32_MAX:
        raise too_large(
            feat, low, high,
            f"with preprocessing.normalization none they reach the model as they are, and float32 holds "
            f"at most {FLOAT32_MAX:.3g}; set normalization zscore or minmax",
        )


def check(col: pd.Series, feat: Any, kind: str) -> None:
    values = pd.to_numeric(col, errors="coerce")
    bad = col[values.isna() & col.notna()]
    if len(bad):
        examples = bad.astype(str).unique()[:3].tolist()
        raise non_numeric(kind, feat, examples, f" (first at row {bad.index[0]})")
    infinite = values[np.isinf(values.astype(float))]
    if len(infinite):
        raise non_finite(kind, feat, f" (first at row {infinite.index[0]})")


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    """Non-numeric values (how many, one example) and infinite ones."""
    # Ray Data reads a CSV column holding text as strings, with "" for missing values.
    values = pd.to_numeric(col.astype(object), errors="coerce")
    return {**bad_summary(col, values.isna().to_numpy() & present(col)), "inf": int(np.isinf(values.astype(float)).sum())}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise non_numeric(kind, feat, examples(summary))
    if int(summary["inf"].sum()):
        raise non_finite(kind, feat)


def fit(col: pd.Series, feat: Any) -> dict[str, Any]:
    values = _numeric(col).dropna()
    with np.errstate(over="ignore"):  # an overflow is named by finite_stats
        mean, std = float(values.mean()), float(values.std(ddof=0))
    low, high = float(values.min()), float(values.max())
    meta = finite_stats(feat, mean, std, low, high)
    check_unscaled(feat, low, high)
    if fills_with_mode(feat):
        meta["mode"] = float(mode(values.value_counts(), feat))
    return meta


def _numeric(col: pd.Series) -> pd.Series:
    """The column as floats, NaN where missing or not a number (``check`` has refused those)."""
    return pd.to_numeric(col, errors="coerce").astype(float)


def fit_ray(train: Any, feats: list[Any]) -> dict[str, dict[str, Any]]:
    """One pass over the split for all the columns: each block's count, mean, sum of
    squared deviations, min and max (one task per block, no shuffle), combined here
    with Chan's parallel formula."""
    cols = [f.col for f in feats]

    def partial(df: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for c in cols:
            v = pd.to_numeric(df[c], errors="coerce").dropna().to_numpy(dtype=float)
            low, high = (float(v.min()), float(v.max())) if len(v) else (np.inf, -np.inf)
            rows.append({"col": c, **moments(v), "min": low, "max": high})
        return pd.DataFrame(rows)

    parts = train.map_batches(partial, batch_format="pandas", batch_size=None).to_pandas()
    meta: dict[str, dict[str, Any]] = {}
    for feat in feats:
        n, mean, m2, low, high = combine_moments(parts[parts["col"] == feat.col])
        if n == 0:  # no values in the training split
            raise no_statistics(feat, "mean and range")
        meta[feat.name] = finite_stats(feat, mean, float(np.sqrt(m2 / n)), low, high)
        check_unscaled(feat, low, high)
    for name, value in modes_ray(train, feats, _numeric).items():
        meta[name]["mode"] = float(value)
    return meta


def moments(values: np.ndarray) -> dict[str, float]:
    """One block's count, mean and sum of squared deviations (M2), for ``pooled``."""
    n = len(values)
    mean = float(values.mean()) if n else 0.0
    return {"n": n, "mean": mean, "m2": float(((values - mean) ** 2).sum()) if n else 0.0}


def pooled(ns: Any, means: Any, m2s: Any) -> tuple[int, float, float]:
    """(n, mean, M2) of the union of blocks given each block's: Chan et al.'s pairwise
    update, stable where sums of squares are not."""
    n, mean, m2 = 0, 0.0, 0.0
    for nb, mb, m2b in zip(ns, means, m2s, strict=True):
        if nb == 0:
            continue
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    return int(n), float(mean), float(m2)


def combine_moments(parts: pd.DataFrame) -> tuple[int, float, float, float, float]:
    """(n, mean, M2, min, max) of the union of blocks given each block's (n, mean, m2,
    min, max)."""
    return (*pooled(parts["n"], parts["mean"], parts["m2"]), float(parts["min"].min()), float(parts["max"].max()))


def transform(col: pd.Series, feat: NumberInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    p = feat.preprocessing
    values = _numeric(col)
    keep = values.notna().to_numpy() if p.missing_value_strategy == "drop_row" else None
    fill = {"fill_with_mean": meta["mean"], FILL_WITH_MODE: meta.get("mode")}.get(p.missing_value_strategy, p.fill_value)
    if p.outlier_strategy is not None:  # the training split's statistics, as for scaling
        outlier = ((values - meta["mean"]).abs() / meta["std"] > p.outlier_threshold).to_numpy()
        if p.outlier_strategy == "drop_row":
            keep = ~outlier if keep is None else keep & ~outlier
        else:
            values = values.mask(outlier, meta["mean"] if p.outlier_strategy == "fill_with_mean" else p.fill_value)
    array = values.fillna(fill).to_numpy()
    if p.normalization == "zscore":
        array = (array - meta["mean"]) / meta["std"]
    elif p.normalization == "minmax":
        array = (array - meta["min"]) / meta["span"]
    return array.astype(np.float32)[:, None], keep


def encoder(feat: NumberInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    return nn.Identity(), 1

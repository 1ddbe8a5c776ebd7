"""Feature preprocessing: check the data, fit statistics and vocabularies, transform.

``fit_metadata`` learns what each feature needs (means, ranges, vocabularies) from the
training split; ``transform`` turns a DataFrame into arrays with the same metadata at
training and prediction time. Every data problem is a ConfigError naming the column.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from raylight.declarative.config import ModelConfig
from raylight.exceptions import ConfigError

PAD, UNK = "<PAD>", "<UNK>"
TEXT_LENGTH = 64
_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str, lowercase: bool) -> list[str]:
    return _TOKEN.findall(text.lower() if lowercase else text)


# The data errors, one wording for the pandas and the Ray Data checks alike.
def missing_column(kind: str, feat: Any, source: str, columns: list[str]) -> ConfigError:
    return ConfigError(
        f"{kind}: feature {feat.name!r} needs column {feat.col!r}, which dataset {source!r} "
        f"does not have; its columns are {columns}. Fix the name (or set `column:`)."
    )


def all_null(feat: Any, source: str) -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} of dataset {source!r} is entirely empty (all null); drop the "
        "feature or fill the column"
    )


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


def finite_stats(feat: Any, mean: float, std: float, low: float, high: float) -> dict[str, float]:
    """A number feature's statistics, checked finite; a constant column scales by 1."""
    if not all(np.isfinite(v) for v in (mean, low, high)):
        raise no_statistics(feat, "mean and range")
    std = std if np.isfinite(std) and std > 0 else 1.0
    span = high - low if np.isfinite(high - low) and high > low else 1.0
    return {"mean": float(mean), "std": float(std), "min": float(low), "span": float(span)}


def check_split_rows(source: str, rows: int, kept: dict[str, int], probabilities: tuple[float, float, float]) -> None:
    """Every split with a non-zero fraction keeps at least one row after drop_row."""
    empty = [name for (name, n), p in zip(kept.items(), probabilities, strict=True) if p > 0 and n == 0]
    if empty:
        counts = ", ".join(f"{k} {v}" for k, v in kept.items())
        raise ConfigError(
            f"dataset {source!r}: the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} "
            f"empty ({rows} rows, after preprocessing and drop_row strategies: {counts}); use more "
            "data, give the split a larger fraction (preprocessing.split.probabilities), set its "
            "fraction to 0, or fill missing values instead of dropping rows"
        )


def check_classes(out: Any, classes: list[Any], source: str) -> None:
    """A classifier's target needs two classes; a binary one at most two."""
    if out.type not in ("binary", "category"):
        return
    if len(classes) < 2:
        raise ConfigError(
            f"target column {out.col!r} ({out.type}) of dataset {source!r} has only one class "
            f"({classes}); a classifier needs at least two"
        )
    if out.type == "binary" and len(classes) > 2:
        raise ConfigError(
            f"target column {out.col!r} is declared binary but has {len(classes)} classes; "
            "declare it as category"
        )


def check_columns(df: pd.DataFrame, config: ModelConfig, *, with_outputs: bool, source: str) -> None:
    features = list(config.input_features) + (list(config.output_features) if with_outputs else [])
    for i, feat in enumerate(features):
        kind = "input_features" if i < len(config.input_features) else "output_features"
        if feat.col not in df.columns:
            raise missing_column(kind, feat, source, list(df.columns))
        col = df[feat.col]
        if col.isna().all():
            raise all_null(feat, source)
        if feat.type == "number":
            values = pd.to_numeric(col, errors="coerce")
            bad = col[values.isna() & col.notna()]
            if len(bad):
                examples = bad.astype(str).unique()[:3].tolist()
                raise non_numeric(kind, feat, examples, f" (first at row {bad.index[0]})")
            infinite = values[np.isinf(values.astype(float))]
            if len(infinite):
                raise non_finite(kind, feat, f" (first at row {infinite.index[0]})")


def check_target(df: pd.DataFrame, config: ModelConfig, source: str) -> None:
    out = config.output_features[0]
    check_classes(out, df[out.col].dropna().unique().tolist(), source)


def _binary_values(col: pd.Series) -> pd.Series:
    if col.dtype == bool:
        return col.astype(float)
    truthy = {"1", "true", "yes", "y", "t", "on", "1.0"}
    return col.map(lambda v: np.nan if pd.isna(v) else float(str(v).strip().lower() in truthy))


def fit_metadata(df: pd.DataFrame, config: ModelConfig) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for feat in config.input_features:
        col = df[feat.col]
        if feat.type == "number":
            values = pd.to_numeric(col, errors="coerce").dropna().astype(float)
            meta[feat.name] = finite_stats(
                feat, float(values.mean()), float(values.std(ddof=0)), float(values.min()), float(values.max())
            )
        elif feat.type == "category":
            cp = feat.preprocessing
            counts = Counter(col.dropna().astype(str))
            kept = [v for v, c in counts.most_common(cp.most_common) if c >= cp.min_frequency]
            meta[feat.name] = {"vocab": [UNK, *kept]}
        elif feat.type == "text":
            tp = feat.preprocessing
            counts = Counter(t for text in col.dropna().astype(str) for t in tokenize(text, tp.lowercase))
            kept = [v for v, c in counts.most_common(tp.most_common) if c >= tp.min_frequency]
            meta[feat.name] = {"vocab": [PAD, UNK, *kept]}
        else:
            meta[feat.name] = {}
    out = config.output_features[0]
    col = df[out.col].dropna()
    if out.type == "category":
        meta[out.name] = {"classes": sorted(col.astype(str).unique().tolist())}
    elif out.type == "binary":
        meta[out.name] = {}
    else:
        values = pd.to_numeric(col, errors="coerce").dropna().astype(float)
        stats = finite_stats(out, float(values.mean()), float(values.std(ddof=0)), float(values.min()), float(values.max()))
        meta[out.name] = {"mean": stats["mean"], "std": stats["std"]}
    return meta


def transform(
    df: pd.DataFrame, config: ModelConfig, meta: dict[str, Any], *, with_outputs: bool
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Arrays for each feature, and the mask of rows kept (drop_row strategies)."""
    keep = np.ones(len(df), dtype=bool)
    arrays: dict[str, np.ndarray] = {}
    for feat in config.input_features:
        col = df[feat.col]
        m = meta[feat.name]
        if feat.type == "number":
            p = feat.preprocessing
            values = pd.to_numeric(col, errors="coerce").astype(float)
            if p.missing_value_strategy == "drop_row":
                keep &= values.notna().to_numpy()
            fill = m["mean"] if p.missing_value_strategy == "fill_with_mean" else p.fill_value
            values = values.fillna(fill).to_numpy()
            if p.normalization == "zscore":
                values = (values - m["mean"]) / m["std"]
            elif p.normalization == "minmax":
                values = (values - m["min"]) / m["span"]
            arrays[feat.name] = values.astype(np.float32)[:, None]
        elif feat.type == "category":
            cp = feat.preprocessing
            if cp.missing_value_strategy == "drop_row":
                keep &= col.notna().to_numpy()
            index = {v: i for i, v in enumerate(m["vocab"])}
            values = col.astype(object).where(col.notna(), cp.fill_value).astype(str)
            arrays[feat.name] = np.array([index.get(v, 0) for v in values], dtype=np.int64)
        elif feat.type == "binary":
            values = _binary_values(col)
            if feat.preprocessing.missing_value_strategy == "drop_row":
                keep &= values.notna().to_numpy()
            arrays[feat.name] = values.fillna(0.0).to_numpy(dtype=np.float32)[:, None]
        else:
            index = {v: i for i, v in enumerate(m["vocab"])}
            ids = np.zeros((len(df), TEXT_LENGTH), dtype=np.int64)
            for r, text in enumerate(col.fillna("").astype(str)):
                tokens = [index.get(t, 1) for t in tokenize(text, feat.preprocessing.lowercase)][:TEXT_LENGTH]
                ids[r, : len(tokens)] = tokens
            arrays[feat.name] = ids
    if with_outputs:
        out = config.output_features[0]
        col = df[out.col]
        keep &= col.notna().to_numpy()
        m = meta[out.name]
        if out.type == "category":
            index = {v: i for i, v in enumerate(m["classes"])}
            arrays[out.name] = np.array([index.get(str(v), 0) for v in col.fillna("")], dtype=np.int64)
        elif out.type == "binary":
            arrays[out.name] = _binary_values(col).fillna(0.0).to_numpy(dtype=np.float32)
        else:
            values = pd.to_numeric(col, errors="coerce").fillna(m["mean"]).to_numpy(dtype=np.float64)
            arrays[out.name] = ((values - m["mean"]) / m["std"]).astype(np.float32)
    return {k: v[keep] for k, v in arrays.items()}, keep


def split_rows(n: int, probabilities: tuple[float, float, float], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    n_train = max(1, round(probabilities[0] * n))
    n_val = round(probabilities[1] * n)
    return order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]

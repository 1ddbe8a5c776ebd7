"""Preprocessing on Ray Data (the ray backend's `processor: ray_data`).

Reading, checks, the split, statistics and vocabularies are computed by Ray Data tasks
over blocks; the driver only sees small summaries (counts, means, vocabularies) and
object references. The transformed arrays stay in the object store (spilled to disk when
they do not fit): each worker reads the blocks it needs one or two at a time (zero-copy on
its node) through ``BlockDataset``, and the loader shards by position; validation and test
metrics are computed a block at a time.
All of it runs before the training workers claim their CPUs, so the two never compete.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from raylight.declarative.config import ModelConfig
from raylight.declarative.dataset import dataset_format, expand
from raylight.declarative.preprocess import (
    PAD,
    UNK,
    all_null,
    check_classes,
    check_split_rows,
    finite_stats,
    missing_column,
    no_statistics,
    non_finite,
    non_numeric,
    tokenize,
    transform,
)
from raylight.exceptions import ConfigError


def _read(path: str) -> Any:
    import fsspec
    import ray.data

    fmt = dataset_format(path)
    files = expand(path)
    fs, _ = fsspec.core.url_to_fs(files[0])
    kwargs: dict[str, Any] = {}
    if "://" in files[0] and not files[0].startswith("file://"):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        kwargs["filesystem"] = PyFileSystem(FSSpecHandler(fs))
        files = [fs._strip_protocol(f) for f in files]
    reader = {"csv": ray.data.read_csv, "parquet": ray.data.read_parquet, "json": ray.data.read_json}[fmt]
    return reader(files, **kwargs)


def _summary(df: pd.DataFrame, config: ModelConfig) -> pd.DataFrame:
    """Per block: rows, non-null counts, non-numeric values in number columns (one
    example) and infinite ones (inputs and a number target alike)."""
    row: dict[str, Any] = {"rows": len(df)}
    for feat in (*config.input_features, *config.output_features):
        col = df[feat.col]
        row[f"notnull:{feat.col}"] = int(col.notna().sum())
        if feat.type == "number":
            # Ray Data reads a CSV column holding text as strings, with "" for missing values.
            present = col.notna() & (col.astype(str).str.strip() != "")
            values = pd.to_numeric(col.astype(object), errors="coerce")
            bad = col[values.isna() & present]
            row[f"bad:{feat.col}"] = len(bad)
            row[f"example:{feat.col}"] = str(bad.iloc[0]) if len(bad) else ""
            row[f"inf:{feat.col}"] = int(np.isinf(values.astype(float)).sum())
    return pd.DataFrame([row])


def prepare_ray_data(config: ModelConfig, dataset: str, *, progress: bool = True) -> dict[str, Any]:
    import logging

    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = progress
    if not progress:
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    ds = _read(dataset)
    columns = ds.schema().names
    for kind, feats in (("input_features", config.input_features), ("output_features", config.output_features)):
        for feat in feats:
            if feat.col not in columns:
                raise missing_column(kind, feat, dataset, columns)
    summary = ds.map_batches(lambda df: _summary(df, config), batch_format="pandas").to_pandas()
    rows = int(summary["rows"].sum())
    if rows == 0:
        raise ConfigError(f"dataset {dataset!r} is empty: it has no rows")
    for feat in (*config.input_features, *config.output_features):
        kind = "input_features" if feat in config.input_features else "output_features"
        if int(summary[f"notnull:{feat.col}"].sum()) == 0:
            raise all_null(feat, dataset)
        if f"bad:{feat.col}" in summary and int(summary[f"bad:{feat.col}"].sum()):
            examples = [e for e in summary[f"example:{feat.col}"] if e][:3]
            raise non_numeric(kind, feat, examples)
        if f"inf:{feat.col}" in summary and int(summary[f"inf:{feat.col}"].sum()):
            raise non_finite(kind, feat)
    out = config.output_features[0]
    if out.type in ("binary", "category"):
        classes = [c for c in ds.unique(out.col) if c is not None and not (isinstance(c, float) and np.isnan(c))]
        check_classes(out, classes, dataset)
    p = config.preprocessing.split.probabilities
    shuffled = ds.random_shuffle(seed=config.trainer.seed)
    train, val, test = shuffled.split_proportionately([p[0], p[1]])
    meta = _fit_metadata(train, config)

    def to_arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
        return transform(df, config, meta, with_outputs=True)[0]

    def refs(part: Any) -> BlockRefs | None:
        return _block_refs(part.map_batches(to_arrays, batch_format="pandas").materialize())

    splits = {"train": refs(train), "validation": refs(val), "test": refs(test)}
    check_split_rows(dataset, rows, {k: len(v) if v is not None else 0 for k, v in splits.items()}, p)
    return {"meta": meta, **splits}


def _fit_metadata(train: Any, config: ModelConfig) -> dict[str, Any]:
    from ray.data.aggregate import Count, Max, Mean, Min, Std

    meta: dict[str, Any] = {}
    numeric = [f for f in config.input_features if f.type == "number"]
    out = config.output_features[0]
    number_cols = [f.col for f in numeric] + ([out.col] if out.type == "number" else [])
    if number_cols:
        def coerce(df: pd.DataFrame) -> pd.DataFrame:
            return pd.DataFrame({c: pd.to_numeric(df[c], errors="coerce").astype(float) for c in number_cols})

        cast = train.map_batches(coerce, batch_format="pandas")
        aggs: list[Any] = [a(c, ignore_nulls=True) for c in number_cols for a in (Mean, Min, Max)]
        aggs += [Std(c, ddof=0, ignore_nulls=True) for c in number_cols]
        stats = cast.aggregate(*aggs)
    def number(feat: Any) -> dict[str, float]:
        values = [stats.get(f"{agg}({feat.col})") for agg in ("mean", "std", "min", "max")]
        if any(v is None for v in values):  # no values in the training split
            raise no_statistics(feat, "mean and range")
        return finite_stats(feat, *(float(v) for v in values))

    for feat in config.input_features:
        if feat.type == "number":
            meta[feat.name] = number(feat)
        elif feat.type == "category":
            counts = train.groupby(feat.col).aggregate(Count()).to_pandas()
            counts = counts[counts[feat.col].notna()].sort_values("count()", ascending=False)
            kept = [str(v) for v, c in zip(counts[feat.col], counts["count()"], strict=True) if c >= feat.preprocessing.min_frequency]
            meta[feat.name] = {"vocab": [UNK, *kept[: feat.preprocessing.most_common]]}
        elif feat.type == "text":
            tp = feat.preprocessing

            def count_tokens(df: pd.DataFrame, col: str = feat.col, lower: bool = tp.lowercase) -> pd.DataFrame:
                c = Counter(t for text in df[col].dropna().astype(str) for t in tokenize(text, lower))
                return pd.DataFrame({"token": list(c), "n": list(c.values())})

            tokens = train.map_batches(count_tokens, batch_format="pandas").to_pandas()
            totals = tokens.groupby("token")["n"].sum().sort_values(ascending=False)
            kept = [t for t, n in totals.items() if n >= tp.min_frequency][: tp.most_common]
            meta[feat.name] = {"vocab": [PAD, UNK, *kept]}
        else:
            meta[feat.name] = {}
    if out.type == "category":
        meta[out.name] = {"classes": sorted(str(c) for c in train.unique(out.col) if c is not None)}
    elif out.type == "binary":
        meta[out.name] = {}
    else:
        target = number(out)
        meta[out.name] = {"mean": target["mean"], "std": target["std"]}
    return meta


@dataclass(frozen=True)
class BlockRefs:
    """A split left in the object store: its blocks (dicts of arrays) and their row counts."""

    blocks: list[Any]
    lengths: list[int]

    def __len__(self) -> int:
        return sum(self.lengths)


def _block_refs(materialized: Any) -> BlockRefs | None:
    import ray

    @ray.remote(num_cpus=0)
    def rows(block: dict[str, np.ndarray]) -> int:
        return len(next(iter(block.values()))) if block else 0

    blocks = materialized.to_numpy_refs()
    lengths = ray.get([rows.remote(b) for b in blocks])  # runs where each block lives
    kept = [(b, n) for b, n in zip(blocks, lengths, strict=True) if n > 0]
    if not kept:
        return None
    return BlockRefs([b for b, _ in kept], [n for _, n in kept])

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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from raylight.declarative.config import ModelConfig
from raylight.declarative.dataset import dataset_format, expand
from raylight.declarative.features import FEATURES
from raylight.declarative.preprocess import (
    all_null,
    check_classes,
    check_split_rows,
    missing_column,
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


def _features(config: ModelConfig) -> list[tuple[str, Any]]:
    """(kind, feature) for the inputs, then the outputs."""
    return [("input_features", f) for f in config.input_features] + [("output_features", f) for f in config.output_features]


def _summary(df: pd.DataFrame, config: ModelConfig) -> pd.DataFrame:
    """Per block: rows, and per feature (``<i>:<key>``, i its place in ``_features``)
    non-null values and what its type's checks need (for a number column, input or
    target: non-numeric values, with one example, and infinite ones)."""
    row: dict[str, Any] = {"rows": len(df)}
    for i, (_, feat) in enumerate(_features(config)):
        col = df[feat.col]
        row[f"{i}:notnull"] = int(col.notna().sum())
        for key, value in FEATURES[feat.type].block_summary(col).items():
            row[f"{i}:{key}"] = value
    return pd.DataFrame([row])


def prepare_ray_data(config: ModelConfig, dataset: str, *, progress: bool = True) -> dict[str, Any]:
    # Ray Data's progress bars and logs follow raylight.verbosity (quiet unless verbose).
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
    for i, (kind, feat) in enumerate(_features(config)):
        if int(summary[f"{i}:notnull"].sum()) == 0:
            raise all_null(feat, dataset)
        keys = {c: c.partition(":")[2] for c in summary.columns if c.startswith(f"{i}:") and c != f"{i}:notnull"}
        FEATURES[feat.type].check_blocks(summary[list(keys)].rename(columns=keys), feat, kind)
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
    """Each type fits all its features at once; a number target joins the number inputs
    (one aggregation over the split for all number columns)."""
    by_type: dict[str, list[Any]] = {}
    for feat in config.input_features:
        by_type.setdefault(feat.type, []).append(feat)
    out = config.output_features[0]
    if out.type == "number":
        by_type.setdefault("number", []).append(out)
    fitted: dict[str, dict[str, Any]] = {}
    for kind, feats in by_type.items():
        fitted.update(FEATURES[kind].fit_ray(train, feats))
    meta = {feat.name: fitted[feat.name] for feat in config.input_features}
    if out.type == "category":
        meta[out.name] = {"classes": sorted(str(c) for c in train.unique(out.col) if c is not None)}
    elif out.type == "binary":
        meta[out.name] = {}
    else:
        meta[out.name] = {"mean": fitted[out.name]["mean"], "std": fitted[out.name]["std"]}
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

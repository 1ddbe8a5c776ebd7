"""Preprocessing data larger than the driver's memory: Ray Data reads, Ray tasks work on
the blocks (the ray backend's `processor: ray_data`, or `auto` above the in-memory limit).

The file is read once into the object store; checks, the split, statistics and
vocabularies and the transform are each one Ray task per block (a few large tasks, no
shuffle service), and the driver only sees small summaries (counts, means, vocabularies)
and object references. The transformed arrays stay in the object store (spilled to disk
when they do not fit): each worker reads the blocks it needs one or two at a time
(zero-copy on its node) through ``BlockDataset``, and the loader shards by position;
validation and test metrics are computed a block at a time.
All of it runs before the training workers reserve their CPUs, so the two never compete.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.config.preprocessing import SplitConfig
from raylight.declarative.dataset import dataset_format, expand, read_fix, refuse_pickled_columns
from raylight.declarative.features import FEATURES
from raylight.declarative.outputs import OUTPUTS
from raylight.declarative.preprocess import (
    all_null,
    bad_split_values,
    balance_block,
    balance_quotas,
    check_dates,
    check_split_rows,
    check_validation_unneeded,
    class_counts,
    date_codes,
    date_keys,
    deal,
    missing_column,
    missing_split_column,
    missing_stratify_column,
    not_splits,
    resolve_files,
    row_codes,
    sample_rows,
    sample_size,
    split_sizes,
    strata,
    transform,
)


def _read(path: str) -> Any:
    import fsspec
    import ray.data

    fmt = dataset_format(path)
    files = expand(path)
    fs, _ = fsspec.core.url_to_fs(files[0])
    if fmt == "parquet":
        for uri in files:  # before any read task unpickles a column of objects
            with fsspec.open(uri, "rb") as f:
                refuse_pickled_columns(uri, f)
    kwargs: dict[str, Any] = {}
    if "://" in files[0] and not files[0].startswith("file://"):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        kwargs["filesystem"] = PyFileSystem(FSSpecHandler(fs))
        files = [fs._strip_protocol(f) for f in files]
    elif _local_files_read_here(path):
        return _read_here(files, fmt)
    reader = {"csv": ray.data.read_csv, "parquet": ray.data.read_parquet, "json": ray.data.read_json}[fmt]
    with _parquet_reader_v1():
        return reader(files, **kwargs)


def _local_files_read_here(path: str) -> bool:
    """Whether files on a local path are read by this process (``read_here``), from this
    cluster's shape."""
    import ray

    from raylight.worker_group.ray_client import client_driver

    try:
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    except Exception:  # Ray cannot say: read as Ray Data does
        alive = 1
    return read_here(path, alive_nodes=alive, client=client_driver())


def read_here(path: str, *, alive_nodes: int, client: bool) -> bool:
    """Whether the driver reads the files of a local path itself and ships them (True), or
    Ray Data's read tasks may (False: one machine). A local path is on the driver's machine
    (unless a shared filesystem is mounted there on every node), and Ray Data's tasks go to
    any node: not only its read tasks, which a label selector could pin, but the Parquet
    footer tasks it starts while planning, which read the file on whatever node they land
    (seen over tests/hosts: FileNotFoundError on a worker's host); and the driver's node
    may have no CPU for them at all (a head started with --num-cpus 0). A Ray Client
    driver's machine is not in the cluster: its files cannot be read there."""
    if client:
        raise ConfigError(
            f"dataset {path}: backend.processor ray_data reads it on the cluster, which cannot see "
            "this machine's files through Ray Client (ray://). Give a URI every node reaches "
            "(s3://, gs://, a shared filesystem's path), or preprocess here with backend.processor: "
            "{type: pandas}"
        )
    return alive_nodes > 1


def _read_here(files: list[str], fmt: str) -> Any:
    """The files read by this process a block at a time (a Parquet row group, a CSV block
    of ``READ_BLOCK_BYTES``, a JSON lines file) into the object store of this node, so the
    driver holds one block at a time and every node reads the blocks from there."""
    import ray
    import ray.data

    refs: list[Any] = [ray.put(block) for block in _blocks(files, fmt)]
    return ray.data.from_arrow_refs(refs)


READ_BLOCK_BYTES = 64 * 1024**2


def _blocks(files: list[str], fmt: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    for uri in files:
        try:
            if fmt == "parquet":
                parquet = pq.ParquetFile(uri)
                for group in range(parquet.num_row_groups):
                    yield parquet.read_row_group(group)
            elif fmt == "csv":  # types from the first block, as Ray Data's read_csv
                for batch in pacsv.open_csv(uri, read_options=pacsv.ReadOptions(block_size=READ_BLOCK_BYTES)):
                    yield pa.Table.from_batches([batch])
            else:  # one block a file, as Ray Data's read_json
                yield pajson.read_json(uri)
        except (pa.ArrowException, OSError, ValueError) as exc:
            problem = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise ConfigError(f"dataset {uri!r} cannot be read as {fmt}: {problem}; {read_fix(fmt)}") from None


# Ray Data's own switch between its two Parquet readers (an explicit value is the user's).
PARQUET_READER_ENV = "RAY_DATA_USE_DATASOURCE_V2"


@contextmanager
def _parquet_reader_v1() -> Iterator[None]:
    """Read Parquet through Ray Data's first reader, unless ``RAY_DATA_USE_DATASOURCE_V2``
    asks otherwise; the user's own ``read_parquet`` calls keep Ray Data's default.

    Ray 2.60's default reader (DataSourceV2) starts a pool of 32 ``FooterReader`` actors
    for every read and kills them when the listing ends. On this project's 2-core machine a
    400-row file took 3.6-3.9 s to read that way and started 5-7 Ray worker processes; the
    first reader took 1.7-1.9 s and 2 (docs/performance.md). Those actors are also killed
    while Ray is still starting them, which makes Ray's GCS print a "Failed to kill actor"
    error to the driver, through raylight's quiet output."""
    import ray.data

    context = ray.data.DataContext.get_current()
    before = getattr(context, "use_datasource_v2", None)
    if before is None or PARQUET_READER_ENV in os.environ:
        yield
        return
    context.use_datasource_v2 = False
    try:
        yield
    finally:
        context.use_datasource_v2 = before


def _features(config: ModelConfig) -> list[tuple[str, Any, Any]]:
    """(kind, feature, its type's module) for the inputs, then the outputs."""
    return [("input_features", f, FEATURES[f.type]) for f in config.input_features] + [
        ("output_features", f, OUTPUTS[f.type]) for f in config.output_features
    ]


MIN_BLOCK_ROWS = 20_000  # fewer rows per block than this: more blocks only add task overhead
SPLIT_COLUMN = "__raylight_split__"


def prepare_ray_data(config: ModelConfig, dataset: str, *, progress: bool = True) -> dict[str, Any]:
    """The three splits as ``BlockRefs`` and the metadata fitted on the training split.

    The file is read once (Ray Data, into the object store) and every later pass is one
    Ray task per block, a handful of large tasks rather than Ray Data's per-operator
    shuffles (its hash shuffle would start aggregator actors and hundreds of partitions
    for a vocabulary): checks and row counts; the split, exact in size and drawn at random,
    with a shuffle that spreads every block's rows over all output blocks; statistics
    and vocabularies (``fit_ray``); the transform to arrays."""
    import ray

    # Ray Data's progress bars and logs follow raylight.base.verbosity (quiet unless verbose).
    # Read it all first: asked of a lazy read, schema() runs the read until one block comes
    # and cancels the read tasks still running, and in Ray 2.60 a cancel that races a
    # task's completion can abort the driver (seen once in the suite: task_manager.cc
    # "Tried to complete task that was not pending"). Materialised, nothing is cancelled.
    ds = _read(dataset).materialize()
    columns = ds.schema().names
    split = config.preprocessing.split
    by_row = split.row_column
    if split.coded_column is not None and split.coded_column not in columns:
        raise missing_split_column(split.coded_column, dataset, columns)
    if split.type == "stratify" and split.column not in columns:
        raise missing_stratify_column(str(split.column), dataset, columns)
    for kind, feats in (("input_features", config.input_features), ("output_features", config.output_features)):
        for feat in feats:
            if feat.col not in columns:
                raise missing_column(kind, feat, dataset, columns)
    blocks = ds.to_pandas_refs()  # read once; the rest starts from these blocks
    if any(hasattr(FEATURES[f.type], "resolve") for f in config.input_features):  # files named relative to the dataset
        blocks = [_task(resolve_files).remote(b, config, dataset) for b in blocks]
    seed = config.trainer.seed
    if config.preprocessing.sampling:  # Ludwig's sample_ratio / sample_size: first
        blocks = _sample(blocks, config, dataset)
    summary = pd.concat(ray.get([_task(_summary).remote(b, config) for b in blocks]), ignore_index=True)
    rows = int(summary["rows"].sum())
    if rows == 0:
        raise ConfigError(f"dataset {dataset!r} is empty: it has no rows")
    for i, (kind, feat, family) in enumerate(_features(config)):
        if int(summary[f"{i}:notnull"].sum()) == 0:
            raise all_null(feat, dataset)
        family.check_blocks(_keyed(summary, f"{i}:", f"{i}:notnull"), feat, kind)
    for j, out in enumerate(config.output_features):
        OUTPUTS[out.type].check_target_blocks(_keyed(summary, f"target{j}:"), out, dataset)
    p = split.probabilities
    if by_row is not None:  # each block's rows of each split, as its column says
        bad = summary[summary["split_bad"].str.len() > 0]
        if len(bad):
            raise bad_split_values(by_row, dataset, bad["split_bad"].iloc[0], f"a row of block {bad.index[0]}")
        quotas: Any = summary[["split0", "split1", "split2"]].to_numpy()
        if split.type == "fixed":
            p = (1.0, 0.0, 0.0)  # the column decides; training needs rows (checked below)
    elif split.type == "datetime":  # every row's place in the order of all the dates: its split
        check_dates(str(split.column), dataset, [e for b in summary["dates_bad"] for e in b][:3], int(summary["dates_null"].sum()))
        codes = date_codes(np.concatenate(list(summary["dates"])), p)
        quotas = np.split(codes, np.cumsum(summary["rows"].to_numpy())[:-1])
        summary = summary.drop(columns="dates")
    elif split.type == "stratify":  # the random split's quotas within each stratum
        counts = pd.DataFrame(list(summary["strata"])).fillna(0).astype(np.int64)
        by_stratum = {key: split_quotas(counts[key].to_numpy(), p, seed + j) for j, key in enumerate(sorted(counts.columns))}
        quotas = [{key: q[i] for key, q in by_stratum.items()} for i in range(len(blocks))]
    else:
        quotas = split_quotas(summary["rows"].to_numpy(), p, seed)
    pieces = output_blocks(len(blocks), rows, int(ray.cluster_resources().get("CPU", 1)))
    scattered = [
        _task(_scatter_fn).options(num_returns=pieces).remote(b, q, pieces, (seed, 1, i), split)
        if pieces > 1
        else [_task(_scatter_fn).remote(b, q, 1, (seed, 1, i), split)]
        for i, (b, q) in enumerate(zip(blocks, quotas, strict=True))
    ]
    gathered = [_task(_gather_fn).options(num_returns=3).remote((seed, 2, j), *[s[j] for s in scattered]) for j in range(pieces)]
    del blocks, scattered
    train_blocks = [g[0] for g in gathered]
    meta = _fit_metadata(ray.data.from_pandas_refs(train_blocks), config)

    def refs(k: int) -> BlockRefs | None:
        done = [_task(_transform_fn).options(num_returns=2).remote(g[k], config, meta) for g in gathered]
        lengths = ray.get([d[1] for d in done])
        kept = [(d[0], n) for d, n in zip(done, lengths, strict=True) if n > 0]
        return BlockRefs([b for b, _ in kept], [n for _, n in kept]) if kept else None

    splits = {name: refs(k) for k, name in enumerate(("train", "validation", "test"))}
    if config.preprocessing.balancing and splits["train"] is not None:
        splits["train"] = _balance(splits["train"], config)
    check_split_rows(dataset, rows, {k: len(v) if v is not None else 0 for k, v in splits.items()}, p)
    if split.type == "fixed" and splits["validation"] is None:
        check_validation_unneeded(config, f"the fixed split's column {by_row!r} gives the validation split no rows")
    return {"meta": meta, **splits}


def _sample(blocks: list[Any], config: ModelConfig, dataset: str) -> list[Any]:
    """The blocks of a sample (rows drawn without replacement, as many as the pandas
    processor's sample, other rows), each in file order."""
    import ray

    sizes = np.array(ray.get([_task(_rows_fn).remote(b) for b in blocks]), dtype=np.int64)
    rows = int(sizes.sum())
    kept = sample_size(config.preprocessing, rows, dataset)
    quotas = deal(sizes, np.array([kept, rows - kept]), (config.trainer.seed, 3))[:, 0]
    return [_task(_sample_fn).remote(b, int(q), (config.trainer.seed, 3, i)) for i, (b, q) in enumerate(zip(blocks, quotas, strict=True))]


def _rows_fn(df: pd.DataFrame) -> int:
    return len(df)


def _sample_fn(df: pd.DataFrame, kept: int, seed: tuple[int, ...]) -> pd.DataFrame:
    return df.iloc[sample_rows(len(df), kept, seed)].reset_index(drop=True) if kept < len(df) else df


def _balance(train: BlockRefs, config: ModelConfig) -> BlockRefs:
    """Ludwig's oversample_minority / undersample_majority on the training blocks: each
    block's quota of either class (one task per block counts, one per block draws)."""
    import ray

    prep, target, seed = config.preprocessing, config.output_features[0].name, config.trainer.seed
    counts = np.array(ray.get([_task(class_counts).remote(b, target) for b in train.blocks]))
    minority, quotas = balance_quotas(counts, prep.oversample_minority, prep.undersample_majority, (seed, 4))
    over = prep.oversample_minority is not None
    kept = [(i, b, q) for i, (b, q) in enumerate(zip(train.blocks, quotas, strict=True)) if q.sum() > 0]  # no empty blocks
    blocks = [_task(balance_block).remote(b, target, minority, q, over, (seed, 4, i)) for i, b, q in kept]
    return BlockRefs(blocks, [int(q.sum()) for _, _, q in kept])


def split_quotas(block_rows: np.ndarray, probabilities: tuple[float, float, float], seed: int) -> np.ndarray:
    """How many rows of each block go to train, validation and test: the totals are
    those of the pandas split (``split_rows``), spread over the blocks as a random
    permutation of all rows would spread them (multivariate hypergeometric draws), so the
    driver never holds a per-row array. Shape (blocks, 3)."""
    return deal(block_rows, np.array(split_sizes(int(block_rows.sum()), probabilities)), seed)


def output_blocks(input_blocks: int, rows: int, cpus: int) -> int:
    """Blocks after the shuffle: as many as were read, more where the CPUs could work on
    more, never so many that a block holds fewer than MIN_BLOCK_ROWS rows."""
    return max(input_blocks, min(cpus, rows // MIN_BLOCK_ROWS), 1)


def _summary(df: pd.DataFrame, config: ModelConfig) -> pd.DataFrame:
    """Per block: rows, each classifier target's first three distinct values (``classes<j>``,
    j its place among the outputs;
    enough to tell one class from two and two from more), and per feature (``<i>:<key>``,
    i its place in ``_features``) non-null values and what its type's checks need (for a
    number column, input or target: non-numeric values, with one example, and infinite
    ones)."""
    row: dict[str, Any] = {"rows": len(df)}
    split = config.preprocessing.split
    if split.row_column is not None:  # each split's rows, and a few values that are none
        codes = row_codes(split, df[split.row_column])
        row.update({f"split{k}": int((codes == k).sum()) for k in range(3)})
        row["split_bad"] = not_splits(df[split.row_column], codes)
    elif split.type == "datetime":  # the dates, in the block's order (put in order by the driver)
        row["dates"], row["dates_bad"], row["dates_null"] = date_keys(df[split.column])
    elif split.type == "stratify":  # rows of each value of the column
        row["strata"] = {str(k): int(n) for k, n in strata(df[split.column]).value_counts().items()}
    for j, out in enumerate(config.output_features):
        for key, value in OUTPUTS[out.type].target_summary(df[out.col], out).items():
            row[f"target{j}:{key}"] = value
    for i, (_, feat, family) in enumerate(_features(config)):
        col = df[feat.col]
        row[f"{i}:notnull"] = int(col.notna().sum())
        for key, value in family.block_summary(col, feat).items():
            row[f"{i}:{key}"] = value
    return pd.DataFrame([row])


def _keyed(summary: pd.DataFrame, prefix: str, *besides: str) -> pd.DataFrame:
    """The columns of ``summary`` that start with ``prefix`` (but ``besides``), without it."""
    keys = {c: c.removeprefix(prefix) for c in summary.columns if c.startswith(prefix) and c not in besides}
    return summary[list(keys)].rename(columns=keys)


@functools.cache
def _task(fn: Any) -> Any:
    """``fn`` as a Ray task, made on first use: importing this module needs no Ray."""
    import ray

    return ray.remote(fn)


def _scatter_fn(df: pd.DataFrame, quota: Any, pieces: int, seed: tuple[int, ...], split: SplitConfig) -> Any:
    """One block's rows, labelled with their split (``quota`` rows each, chosen at
    random; for a fixed or hash split, as its column says; stratified, ``quota`` is each
    stratum's of the column) and dealt at random to ``pieces`` output blocks."""
    rng = np.random.default_rng(seed)
    if split.row_column is not None:
        labels = row_codes(split, df[split.row_column])
    elif split.type == "datetime":  # each row's split, from the order of all the dates
        labels = quota
    elif split.type == "stratify":
        keys = strata(df[split.column]).to_numpy()
        labels = np.zeros(len(df), dtype=np.int8)
        for key, q in sorted(quota.items()):
            labels[keys == key] = rng.permutation(np.repeat(np.arange(3, dtype=np.int8), q))
    else:
        labels = rng.permutation(np.repeat(np.arange(3, dtype=np.int8), quota))
    dest = rng.integers(pieces, size=len(df))
    df = df.assign(**{SPLIT_COLUMN: labels})
    parts = [df[dest == j] for j in range(pieces)]
    return parts if pieces > 1 else parts[0]


def _gather_fn(seed: tuple[int, ...], *parts: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One output block: its pieces from every input block, rows in random order, as
    train, validation and test."""
    df = pd.concat(parts, ignore_index=True)
    df = df.iloc[np.random.default_rng(seed).permutation(len(df))]
    split = df.pop(SPLIT_COLUMN).to_numpy()
    return tuple(df[split == k].reset_index(drop=True) for k in range(3))


def _transform_fn(df: pd.DataFrame, config: ModelConfig, meta: dict[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    arrays = transform(df, config, meta, with_outputs=True)[0]
    return arrays, len(next(iter(arrays.values())))


def _fit_metadata(train: Any, config: ModelConfig) -> dict[str, Any]:
    """Each input type fits all its features at once (one aggregation over the split for
    all number columns, say), and each output type its outputs."""
    by_type: dict[str, list[Any]] = {}
    for feat in config.input_features:
        by_type.setdefault(feat.type, []).append(feat)
    fitted: dict[str, dict[str, Any]] = {}
    for kind, feats in by_type.items():
        fitted.update(FEATURES[kind].fit_ray(train, feats))
    outs: dict[str, list[Any]] = {}
    for out in config.output_features:
        outs.setdefault(out.type, []).append(out)
    for kind, feats in outs.items():
        fitted.update(OUTPUTS[kind].fit_ray(train, feats))
    return {feat.name: fitted[feat.name] for feat in (*config.input_features, *config.output_features)}


@dataclass(frozen=True)
class BlockRefs:
    """A split left in the object store: its blocks (dicts of arrays) and their row counts."""

    blocks: list[Any]
    lengths: list[int]

    def __len__(self) -> int:
        return sum(self.lengths)

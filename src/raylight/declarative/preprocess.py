"""Feature preprocessing: check the data, fit statistics and vocabularies, transform.

``fit_metadata`` learns what each feature needs (means, ranges, vocabularies) from the
training split; ``transform`` turns a DataFrame into arrays with the same metadata at
training and prediction time. Every data problem is a ConfigError naming the column.
What is particular to a type is its module's in ``features`` (inputs) or ``outputs``.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pandas as pd

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.dataset import dataset_directory
from raylight.declarative.features import FEATURES
from raylight.declarative.features.base import present
from raylight.declarative.outputs import OUTPUTS


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


def check_validation_unneeded(config: Any, why: str) -> None:
    """A run without validation rows: early stopping and the best model follow the training
    loss, and nothing else may ask for a validation metric."""
    t, needs = config.trainer, []
    if t.validation_metric != "loss":
        needs.append(f"trainer.validation_metric ({t.validation_metric})")
    sched = t.learning_rate_scheduler
    if sched is not None and sched.reduce_on_plateau > 0 and sched.reduce_eval_split == "validation":
        needs.append("trainer.learning_rate_scheduler.reduce_eval_split (validation)")
    if needs:
        raise ConfigError(f"{why}, but {' and '.join(needs)} needs one; give rows the value 1, or measure on training")


def check_hits_at_k(config: Any, meta: dict[str, Any]) -> None:
    """A category output measures hits_at_k only with more classes than its top_k (Ludwig's
    rule: with fewer, every row's class is among the top k); a setting that follows it
    there is a ConfigError."""
    t, h, sched = config.trainer, config.hyperopt, config.trainer.learning_rate_scheduler
    asks = [("trainer.validation_metric", t.validation_field, t.validation_metric)]
    if sched is not None and sched.reduce_on_plateau > 0:
        asks.append(("trainer.learning_rate_scheduler.reduce_eval_metric", t.validation_field, sched.reduce_eval_metric))
    if h is not None:
        asks.append(("hyperopt.metric", h.output_feature, h.metric))
    outputs = {out.name: out for out in config.output_features}
    for key, field, metric in asks:
        out = outputs.get(field, config.output_features[0] if len(outputs) == 1 else None)
        if metric != "hits_at_k" or out is None or not hasattr(out, "top_k"):  # a category output
            continue
        classes = len(meta[out.name]["classes"])
        if classes <= out.top_k:
            raise ConfigError(
                f"{key}: hits_at_k of output {out.name!r} counts a row right when its class is among the "
                f"{out.top_k} most likely (top_k), but the output has {classes} classes, so every row is, and it is "
                f"not measured; follow accuracy, or set the output's top_k below {classes}"
            )


def sample_size(prep: Any, rows: int, source: str) -> int:
    """How many of a dataset's ``rows`` its sample keeps (``prep.sampled``); a sample of
    rows that keeps none is a ConfigError."""
    kept = int(prep.sampled(rows))
    if kept == 0 and rows > 0:
        raise ConfigError(
            f"preprocessing.sample_ratio: {prep.sample_ratio:g} of the {rows} rows of dataset {source!r} keeps "
            "none; raise it or use more data"
        )
    return kept


def sample_rows(rows: int, kept: int, seed: tuple[int, ...]) -> np.ndarray:
    """The ``kept`` rows of ``rows`` a sample trains on, drawn without replacement, in file order."""
    return np.sort(np.random.default_rng(seed).choice(rows, kept, replace=False))


def deal(block_rows: np.ndarray, totals: np.ndarray, seed: int | tuple[int, ...]) -> np.ndarray:
    """How many of each block's rows fall in each of ``totals`` (which sum to the rows), as
    a random permutation of all rows would deal them. Shape (blocks, len(totals))."""
    left = totals.astype(np.int64)
    rng = np.random.default_rng(seed)
    quotas = np.zeros((len(block_rows), len(totals)), dtype=np.int64)
    for i, size in enumerate(block_rows):
        quotas[i] = rng.multivariate_hypergeometric(left, int(size))
        left -= quotas[i]
    return quotas


def balance_quotas(
    block_counts: np.ndarray, over: float | None, under: float | None, seed: tuple[int, ...],
) -> tuple[int, np.ndarray]:
    """Ludwig's class balancing of a binary training split, whose blocks hold
    ``block_counts[i] = (rows of class 0, rows of class 1)``: the minority class, and each
    block's (minority, majority) rows after it. ``over``: the minority drawn with
    replacement to ``over`` x the majority's rows (each draw a row of any block alike);
    ``under``: the majority kept down to the minority's rows / ``under``, without
    replacement (dealt over the blocks as a permutation would)."""
    totals = block_counts.sum(axis=0)
    majority = int(np.argmax(totals))
    minority = 1 - majority
    if totals[minority] == 0:
        raise ConfigError(
            f"preprocessing.{'oversample_minority' if over is not None else 'undersample_majority'}: the "
            "training split holds one class only; there is nothing to balance (use more data or remove the key)"
        )
    rng = np.random.default_rng(seed)
    mins, majs = block_counts[:, minority], block_counts[:, majority]
    if over is not None:
        mins = rng.multinomial(round(totals[majority] * over), mins / totals[minority])
    else:
        kept = min(int(totals[majority]), int(totals[minority] / under)) if under else int(totals[majority])
        majs = deal(majs, np.array([kept, totals[majority] - kept]), seed)[:, 0]
    return minority, np.stack([mins, majs], axis=1)


def balance_block(
    arrays: dict[str, np.ndarray], target: str, minority: int, quota: Any, over: bool, seed: tuple[int, ...],
) -> dict[str, np.ndarray]:
    """One block's rows after balancing: ``quota`` = (minority rows, majority rows); the
    class ``over``-sampled is drawn with replacement, the other kept (or, undersampled,
    drawn without). Minority rows first, as Ludwig concatenates them; training shuffles."""
    y = arrays[target]
    rng = np.random.default_rng(seed)
    mins, majs = np.flatnonzero(y == minority), np.flatnonzero(y != minority)
    if over:
        mins = rng.choice(mins, int(quota[0]), replace=True) if len(mins) else mins
    else:
        majs = np.sort(rng.choice(majs, int(quota[1]), replace=False))
    rows = np.concatenate([mins, majs])
    return {k: v[rows] for k, v in arrays.items()}


def class_counts(arrays: dict[str, np.ndarray], target: str) -> np.ndarray:
    """A binary target's rows of class 0 and of class 1."""
    ones = int(np.count_nonzero(arrays[target] == 1))
    return np.array([len(arrays[target]) - ones, ones], dtype=np.int64)


def check_columns(df: pd.DataFrame, config: ModelConfig, *, with_outputs: bool, source: str) -> None:
    features = list(config.input_features) + (list(config.output_features) if with_outputs else [])
    for i, feat in enumerate(features):
        kind = "input_features" if i < len(config.input_features) else "output_features"
        if feat.col not in df.columns:
            raise missing_column(kind, feat, source, list(df.columns))
        col = df[feat.col]
        if col.isna().all():
            raise all_null(feat, source)
        (FEATURES[feat.type] if kind == "input_features" else OUTPUTS[feat.type]).check(col, feat, kind)


def resolve_files(df: pd.DataFrame, config: ModelConfig, dataset: str) -> pd.DataFrame:
    """``df`` read from ``dataset``, with the file paths its inputs name (an image's) joined
    to the dataset file's directory where they are relative: the types whose cells name
    files have ``resolve(col, base)`` (the others nothing to resolve). A DataFrame given
    to ``predict`` in Python keeps its paths, relative to the working directory."""
    resolving = [f for f in config.input_features if hasattr(FEATURES[f.type], "resolve") and f.col in df.columns]
    if not resolving:
        return df
    base = dataset_directory(dataset)
    return df.assign(**{f.col: FEATURES[f.type].resolve(df[f.col], base) for f in resolving})  # type: ignore[attr-defined]


def check_target(df: pd.DataFrame, config: ModelConfig, source: str) -> None:
    for out in config.output_features:
        OUTPUTS[out.type].check_target(df[out.col], out, source)


def fit_metadata(df: pd.DataFrame, config: ModelConfig) -> dict[str, Any]:
    meta = {feat.name: FEATURES[feat.type].fit(df[feat.col], feat) for feat in config.input_features}
    for out in config.output_features:
        meta[out.name] = OUTPUTS[out.type].fit(df[out.col], out)
    return meta


def transform(
    df: pd.DataFrame, config: ModelConfig, meta: dict[str, Any], *, with_outputs: bool
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Arrays for each feature, and the mask of rows kept (drop_row strategies)."""
    keep = np.ones(len(df), dtype=bool)
    arrays: dict[str, np.ndarray] = {}
    for feat in config.input_features:
        array, kept = FEATURES[feat.type].transform(df[feat.col], feat, meta[feat.name])
        if kept is not None:
            keep &= kept
        arrays[feat.name] = array
    # A row lacking any output's target is dropped (Ludwig's drop_row for outputs).
    for out in config.output_features if with_outputs else ():
        arrays[out.name], kept = OUTPUTS[out.type].transform(df[out.col], out, meta[out.name])
        keep &= kept
    return {k: v[keep] for k, v in arrays.items()}, keep


def coded_split_rows(df: pd.DataFrame, split: Any, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed, hash or datetime split (``split.coded_column``): the rows of train,
    validation and test, in file order. A fixed split's column holding anything but 0, 1
    and 2 (numbers or their strings), or a datetime split's holding no date, is a
    ConfigError naming it."""
    column = split.coded_column
    if column not in df.columns:
        raise missing_split_column(column, source, list(df.columns))
    if split.type == "datetime":
        keys, bad, nulls = date_keys(df[column])
        check_dates(column, source, bad, nulls)
        codes = date_codes(keys, split.probabilities)
    else:
        codes = row_codes(split, df[column])
        if (codes < 0).any():
            first = int(np.flatnonzero(codes < 0)[0])
            raise bad_split_values(column, source, not_splits(df[column], codes), f"row {first}")
    return tuple(np.flatnonzero(codes == k) for k in range(3))  # type: ignore[return-value]


def row_codes(split: Any, values: pd.Series) -> np.ndarray:
    """Each row's split (0, 1, 2) in a fixed or hash split, from its own value alone (so any
    block of rows gets the same as the whole file); -1 for a fixed split's bad value."""
    return hash_codes(values, split.probabilities) if split.type == "hash" else split_codes(values)


def hash_codes(values: pd.Series, probabilities: tuple[float, float, float]) -> np.ndarray:
    """Ludwig's hash split: the CRC-32 of each value's text, over 2**32, falls in train,
    validation or test by the cumulative ``probabilities``. A number is its text as an
    integer when it is one (5 and 5.0 alike: a column with nulls reads as floats), nulls are
    one value. Not Ludwig's exact hash (it hashes a JSON of the value): the same kind of
    split, not the same rows."""
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        num = values.astype("float64")
        whole = num.notna() & (num == np.floor(num)) & (num.abs() < 2**53)
        text = num.astype(str).astype(object)
        text[whole] = num[whole].astype(np.int64).astype(str)
        keys = text.where(num.notna(), "<null>").to_numpy()
    else:
        keys = strata(values).to_numpy()
    unit = np.fromiter((zlib.crc32(str(k).encode()) for k in keys), dtype=np.float64, count=len(keys)) / 2**32
    return np.searchsorted(np.cumsum(probabilities[:2]), unit, side="right").astype(np.int8)


def split_codes(values: pd.Series) -> np.ndarray:
    """A fixed split column's codes: 0, 1, 2 (numbers or their strings); -1 for anything else."""
    codes = pd.to_numeric(values.astype(str).str.strip(), errors="coerce")
    return np.where(codes.isin([0, 1, 2]), codes.fillna(-1), -1).astype(np.int8)


def not_splits(values: pd.Series, codes: np.ndarray) -> list[str]:
    """Up to three of a fixed split column's values that are not 0, 1 or 2 (``codes`` < 0)."""
    return [str(v) for v in values[codes < 0].drop_duplicates().head(3)]


def missing_split_column(column: str, source: str, columns: list[str]) -> ConfigError:
    return ConfigError(
        f"preprocessing.split.column {column!r}: dataset {source!r} has no such column; its columns are {columns}"
    )


def bad_split_values(column: str, source: str, examples: list[str], first: str) -> ConfigError:
    return ConfigError(
        f"preprocessing.split.column {column!r}: column of dataset {source!r} holds values other than 0 "
        f"(train), 1 (validation) and 2 (test), such as {examples} (first at {first}); fix the column, or "
        "use split type random"
    )


def date_keys(values: pd.Series) -> tuple[np.ndarray, list[str], int]:
    """A datetime split column as nanoseconds since the epoch (UTC where a value has a
    zone), the examples of values that are not dates, and how many are null."""
    here = present(values)
    parsed = pd.to_datetime(values.where(here), errors="coerce", format="mixed", utc=True)
    bad = values[here & parsed.isna().to_numpy()]
    keys = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return keys, [str(v) for v in bad.drop_duplicates().head(3)], int((~here).sum())


def check_dates(column: str, source: str, bad: list[str], nulls: int) -> None:
    if bad:
        raise ConfigError(
            f"preprocessing.split.column {column!r}: column of dataset {source!r} holds values that are "
            f"not dates, such as {bad}; fix the column, or use another split type"
        )
    if nulls:
        raise ConfigError(
            f"preprocessing.split.column {column!r}: {nulls} row(s) of dataset {source!r} have no date, so "
            "no place in the order; fill or drop them"
        )


def date_codes(keys: np.ndarray, probabilities: tuple[float, float, float]) -> np.ndarray:
    """Ludwig's datetime split: the rows in order of their dates (ties in file order), the
    first ``split_sizes`` rows train, the next validation, the last test."""
    codes = np.empty(len(keys), dtype=np.int8)
    codes[np.argsort(keys, kind="stable")] = np.repeat(np.arange(3, dtype=np.int8), split_sizes(len(keys), probabilities))
    return codes



def split_sizes(n: int, probabilities: tuple[float, float, float]) -> tuple[int, int, int]:
    """Rows of train, validation and test for ``n`` rows split by ``probabilities`` (train
    keeps at least one)."""
    n_train = min(n, max(1, round(probabilities[0] * n)))
    n_val = min(n - n_train, round(probabilities[1] * n))
    return n_train, n_val, n - n_train - n_val


def split_rows(n: int, probabilities: tuple[float, float, float], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    n_train, n_val, _ = split_sizes(n, probabilities)
    return order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]


def strata(values: pd.Series) -> pd.Series:
    """A stratify column's values as the strings its strata are named by (nulls: one
    stratum of their own, ``<null>``)."""
    return values.astype("string").fillna("<null>").astype(object)


def stratified_split_rows(
    values: pd.Series, probabilities: tuple[float, float, float], seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ludwig's stratified split: ``split_rows`` within each value of ``values`` (in sorted
    order of the values' strings), so that every split keeps their proportions."""
    keys = strata(values).to_numpy()
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for key in sorted(set(keys)):
        rows = rng.permutation(np.flatnonzero(keys == key))
        n_train, n_val, _ = split_sizes(len(rows), probabilities)
        for k, chunk in enumerate((rows[:n_train], rows[n_train : n_train + n_val], rows[n_train + n_val :])):
            parts[k].append(chunk)
    return tuple(np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in parts)  # type: ignore[return-value]


def missing_stratify_column(column: str, source: str, columns: list[str]) -> ConfigError:
    return ConfigError(
        f"preprocessing.split.column {column!r}: dataset {source!r} has no such column to stratify on; "
        f"its columns are {columns}"
    )

"""Date features, as Ludwig's: each date becomes nine numbers (year, month, day, weekday,
day of the year, hour, minute, second, second of the day), encoded by embeddings of the
cyclic ones (``embed``) or their cosines (``wave``), the year through a linear unit, the
second of the day as a cosine, then optional fully connected layers.

Dates are read as written: a value with a zone keeps its wall-clock time (``10:00+02:00``
is hour 10), as Ludwig's parser does. Unlike Ludwig, the year is standardised by the
training split's mean and deviation before its linear unit, a missing date is filled with
the training split's mean date (Ludwig's fill is the time of preprocessing), and a value
that is not a date is an error naming the column (Ludwig logs it and fills).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    MAX_WIDTH,
    FeatureModel,
    bad_cells,
    bad_summary,
    examples,
    present,
)
from raylight.declarative.features.number import moments, pooled
from raylight.declarative.layers import FCStackConfig

if TYPE_CHECKING:
    from torch import nn

# The columns of the array a date becomes (Ludwig's create_vector_from_datetime_obj).
YEAR, SECOND_OF_DAY = 0, 8
# (name, size, column, first value): the cyclic parts, embedded (embed) or as cosines of
# that period (wave), as Ludwig's DATE_COMPONENTS.
CYCLES = (
    ("month", 12, 1, 1), ("day", 31, 2, 1), ("weekday", 7, 3, 0), ("yearday", 366, 4, 1),
    ("hour", 24, 5, 0), ("minute", 60, 6, 0), ("second", 60, 7, 0),
)
DAY_S = 86_400
_NS = 1_000_000_000


class DatePreprocessing(ConfigModel):
    missing_value_strategy: Literal["fill_with_const", "drop_row"] = Field(
        "fill_with_const", description="What replaces a missing date: fill_value, or the row dropped."
    )
    fill_value: str = Field(
        "",
        description="The date fill_with_const puts in a missing one; empty: the training split's mean date "
        "(Ludwig's empty fill is the time of preprocessing).",
    )
    datetime_format: str | None = Field(
        None,
        description="The column's format in strftime codes (%Y-%m-%d %H:%M); null: any format pandas "
        "reads, each value on its own.",
    )

    @field_validator("fill_value")
    @classmethod
    def _a_date(cls, value: str) -> str:
        if value.strip():
            try:
                pd.Timestamp(value)
            except (ValueError, TypeError, OverflowError) as e:
                raise ValueError(f"{value!r} is not a date ({e}); write one such as 2020-01-31, or leave it empty") from None
        return value


class DateEncoder(FCStackConfig):
    """Ludwig's date encoders; ``fc_layers`` (or Ludwig's ``num_fc_layers`` x ``output_size``)
    after the concatenated parts, none by default as in Ludwig."""

    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 10

    type: Literal["embed", "wave"] = Field(
        "embed", description="embed: an embedding of each cyclic part; wave: the cosine of each over its period."
    )
    embedding_size: int = Field(10, ge=1, le=MAX_WIDTH, description="Size of each part's embedding (embed).")


class DateInput(FeatureModel):
    type: Literal["date"]
    preprocessing: DatePreprocessing = Field(default_factory=lambda: DatePreprocessing(), description="Date preprocessing.")
    encoder: DateEncoder = Field(default_factory=lambda: DateEncoder(), description="Date encoder.")


Input = DateInput
INFER_RANK = 2  # before text: "Jan 5, 2020 10:00 am" has four words
_INFER_SAMPLE = 1000


def infers(values: pd.Series) -> bool:
    """Datetime columns, and text columns whose every value (of the first 1000) holds a
    four-digit run (a year) and parses as a date: "3-4" or "May" stay categories."""
    if pd.api.types.is_datetime64_any_dtype(values):
        return True
    if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values) or values.empty:
        return False
    text = values.head(_INFER_SAMPLE).astype(str)
    if not text.str.contains(r"\d{4}").all():
        return False
    _, bad = parse(text, None)
    return not bad.any()


def _one(value: Any, fmt: str | None) -> pd.Timestamp | Any:
    try:
        stamp = pd.Timestamp(pd.to_datetime(value, format=fmt))
    except (ValueError, TypeError, OverflowError):
        return pd.NaT
    return stamp.tz_localize(None) if stamp.tzinfo is not None else stamp


def _from_numbers(values: pd.Series) -> pd.Series:
    """POSIX timestamps, as Ludwig reads a number: seconds, or milli-, micro- or
    nanoseconds where the value has more than ten digits."""
    v = values.astype(float)
    digits = np.floor(np.log10(v.where(v > 0)))
    scale = np.power(10.0, (digits - 9).clip(lower=0).fillna(0))
    return pd.to_datetime(v / scale, unit="s", errors="coerce")


def parse(col: pd.Series, fmt: str | None) -> tuple[pd.Series, pd.Series]:
    """The column as naive timestamps (wall-clock time where a value has a zone; NaT where
    missing or not a date), and the mask of values present that are not dates."""
    here = pd.Series(present(col), index=col.index)
    if pd.api.types.is_datetime64_any_dtype(col):
        stamps = col.dt.tz_localize(None) if getattr(col.dt, "tz", None) is not None else col
        return stamps.astype("datetime64[ns]"), here & stamps.isna()
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        stamps = _from_numbers(col)
        return stamps.astype("datetime64[ns]"), here & stamps.isna()
    text = col.where(here).astype(object)
    try:
        stamps = pd.to_datetime(text, errors="coerce", format=fmt or "mixed")
        if getattr(stamps.dt, "tz", None) is not None:
            stamps = stamps.dt.tz_localize(None)
    except (ValueError, TypeError):  # zones that differ between values: one value at a time
        stamps = pd.Series([_one(v, fmt) if isinstance(v, str) else pd.NaT for v in text], index=col.index)
    stamps = pd.Series(pd.to_datetime(stamps), index=col.index)
    numeric = here & stamps.isna()
    if numeric.any():  # strings of digits: timestamps, as Ludwig reads them
        as_numbers = pd.to_numeric(col[numeric], errors="coerce")
        stamps.loc[numeric] = _from_numbers(as_numbers.dropna()).reindex(as_numbers.index)
    return stamps.astype("datetime64[ns]"), here & stamps.isna()


def not_dates(kind: str, feat: Any, examples: list[str], where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type date) holds values that are not dates, such as "
        f"{examples}{where}; give the column's format as preprocessing.datetime_format (e.g. '%d/%m/%Y %H:%M'), "
        "clean the column, or declare the feature as category"
    )


def check(col: pd.Series, feat: Any, kind: str) -> None:
    _, bad = parse(col, feat.preprocessing.datetime_format)
    if bad.any():
        raise not_dates(kind, feat, *bad_cells(col, bad))


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    """Values that are not dates in the feature's format: how many, one example."""
    return bad_summary(col, parse(col, feat.preprocessing.datetime_format)[1].to_numpy())


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise not_dates(kind, feat, examples(summary))


def _moments(stamps: pd.Series) -> dict[str, float]:
    """The moments (``number.moments``) of the years and of the timestamps (seconds)."""
    valid = stamps.dropna()
    years, seconds = valid.dt.year.to_numpy(float), valid.to_numpy("datetime64[ns]").astype(np.int64) / _NS
    return {f"{name}_{k}": v for name, values in (("year", years), ("t", seconds)) for k, v in moments(values).items()}


def _meta(feat: Any, parts: pd.DataFrame) -> dict[str, Any]:
    stats = {}
    for name in ("year", "t"):
        n, mean, m2 = pooled(parts[f"{name}_n"], parts[f"{name}_mean"], parts[f"{name}_m2"])
        stats[name] = (n, mean, math.sqrt(m2 / n) if n else 0.0)
    n, year_mean, year_std = stats["year"]
    if n == 0:
        raise ConfigError(
            f"column {feat.col!r} (feature {feat.name!r}, type date) has no dates in the training split, so its "
            "mean date and year cannot be computed; fill the column or drop the feature"
        )
    mean_date = pd.Timestamp(round(stats["t"][1]), unit="s").isoformat()  # to the second, the finest part a date keeps
    return {"year_mean": year_mean, "year_std": year_std if year_std > 0 else 1.0, "mean_date": mean_date}


def fit(col: pd.Series, feat: DateInput) -> dict[str, Any]:
    stamps, _ = parse(col, feat.preprocessing.datetime_format)
    return _meta(feat, pd.DataFrame([_moments(stamps)]))


def fit_ray(train: Any, feats: list[DateInput]) -> dict[str, dict[str, Any]]:
    """One pass over the split for all the columns: each block's count and moments of the
    years and timestamps (one task per block, no shuffle), combined here as numbers' are."""
    formats = {f.col: f.preprocessing.datetime_format for f in feats}

    def partial(df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame([{"col": c, **_moments(parse(df[c], fmt)[0])} for c, fmt in formats.items()])

    parts = train.map_batches(partial, batch_format="pandas", batch_size=None).to_pandas()
    return {f.name: _meta(f, parts[parts["col"] == f.col]) for f in feats}


def transform(col: pd.Series, feat: DateInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    p = feat.preprocessing
    stamps, bad = parse(col, p.datetime_format)
    if bad.any():  # a dataset to predict on
        raise not_dates("input_features", feat, *bad_cells(col, bad))
    keep = stamps.notna().to_numpy() if p.missing_value_strategy == "drop_row" else None
    fill = pd.Timestamp(p.fill_value) if p.fill_value.strip() else pd.Timestamp(meta["mean_date"])
    if fill.tzinfo is not None:
        fill = fill.tz_localize(None)
    d = stamps.fillna(fill).dt
    seconds = d.hour * 3600 + d.minute * 60 + d.second
    parts = (d.year, d.month, d.day, d.day_of_week, d.day_of_year, d.hour, d.minute, d.second, seconds)
    return np.stack([np.asarray(v, dtype=np.int64) for v in parts], axis=1), keep


def encoder(feat: DateInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from raylight.declarative.models.encoders import DateModule

    module = DateModule(feat.encoder, meta["year_mean"], meta["year_std"])
    return module, module.width

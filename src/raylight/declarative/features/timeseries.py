"""Timeseries features, as Ludwig's: each row a series of numbers (a cell of numbers split
by ``tokenizer``, or a list in Parquet or JSON), cut to the longest training row (at most
``timeseries_length_limit``) and padded with ``padding_value``; encoded by Ludwig's
default for them, ``parallel_cnn``, or any of text's other sequence encoders, over the
series as one channel (text's encoders without their embeddings, as Ludwig's timeseries
feature sets them). Values are not scaled, as in Ludwig."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    FeatureModel,
    bad_cells,
    bad_summary,
    examples,
    numbers,
)
from raylight.declarative.features.text import TextEncoder, Tokenizer, tokenize

if TYPE_CHECKING:
    from torch import nn


class TimeseriesPreprocessing(ConfigModel):
    tokenizer: Tokenizer = Field("space", description="How a cell splits into numbers (Ludwig's; default: on white space).")
    timeseries_length_limit: int = Field(256, ge=1, le=65_536, description="The most steps kept of a row, from its start.")
    padding_value: float = Field(0.0, description="What pads a shorter row.")
    padding: Literal["right", "left"] = Field("right", description="Which side a shorter row is padded on.")
    missing_value_strategy: Literal["fill_with_const", "drop_row"] = Field(
        "fill_with_const", description="What replaces a missing series: fill_value, or the row dropped."
    )
    fill_value: str = Field("", description="fill_with_const's series, numbers as the tokenizer splits them; empty: all padding.")

    @field_validator("padding_value")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class TimeseriesEncoder(TextEncoder):
    """Ludwig's sequence encoders over the series, its values one channel (their settings
    as text's; embedding_size is unused)."""

    type: Literal["parallel_cnn", "stacked_cnn", "stacked_parallel_cnn", "rnn", "cnnrnn", "transformer"] = Field(
        "parallel_cnn",
        description="parallel_cnn (Ludwig's default for timeseries), stacked_cnn, stacked_parallel_cnn, rnn, cnnrnn or transformer.",
    )

    @model_validator(mode="before")
    @classmethod
    def _is_parallel_cnn(cls, data: Any) -> Any:
        return {"type": "parallel_cnn", **data} if isinstance(data, dict) and "type" not in data else data


class TimeseriesInput(FeatureModel):
    type: Literal["timeseries"]
    preprocessing: TimeseriesPreprocessing = Field(
        default_factory=lambda: TimeseriesPreprocessing(), description="Timeseries preprocessing."
    )
    encoder: TimeseriesEncoder = Field(default_factory=lambda: TimeseriesEncoder(), description="Timeseries encoder.")


Input = TimeseriesInput
INFER_RANK = 53  # claims no column: a series reads as a vector or text


def infers(values: pd.Series) -> bool:
    return False


def parse(col: pd.Series, p: Any) -> tuple[list[np.ndarray | None], np.ndarray]:
    """Each row's numbers (None where missing), and the mask of rows that are not series
    of finite numbers."""
    return numbers(col, lambda text: tokenize(text, p))


def not_series(kind: str, feat: Any, examples: list[str], where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type timeseries) holds values that are not series of finite "
        f"numbers, such as {examples}{where}; write each as numbers split by preprocessing.tokenizer (or a list in "
        "Parquet or JSON), or leave the cell empty to treat it as missing"
    )


def check(col: pd.Series, feat: Any, kind: str) -> None:
    _, bad = parse(col, feat.preprocessing)
    if bad.any():
        raise not_series(kind, feat, *bad_cells(col, bad))


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    """Values that are not series of finite numbers: how many, one example."""
    return bad_summary(col, parse(col, feat.preprocessing)[1])


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise not_series(kind, feat, examples(summary))


def _length(feat: Any, longest: int) -> dict[str, Any]:
    return {"length": max(1, min(feat.preprocessing.timeseries_length_limit, longest))}


def fit(col: pd.Series, feat: Any) -> dict[str, Any]:
    """The length of the rows: an input's, or a timeseries output's (its horizon)."""
    return _length(feat, _longest(col, feat.preprocessing))


def _longest(col: pd.Series, p: Any) -> int:
    return max((len(v) for v in parse(col, p)[0] if v is not None), default=0)


def fit_ray(train: Any, feats: list[Any]) -> dict[str, dict[str, Any]]:
    """One pass over the split: each block's longest row (its values were checked by
    ``block_summary``)."""
    specs = [(f.name, f.col, f.preprocessing) for f in feats]

    def longest(df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame([{"name": name, "n": _longest(df[c], p)} for name, c, p in specs])

    table = train.map_batches(longest, batch_format="pandas", batch_size=None).to_pandas()
    return {f.name: _length(f, int(table.loc[table["name"] == f.name, "n"].max())) for f in feats}


def transform(col: pd.Series, feat: TimeseriesInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    p, length = feat.preprocessing, meta["length"]
    values, bad = parse(col, p)
    if bad.any():  # a dataset to predict on
        raise not_series("input_features", feat, *bad_cells(col, bad))
    fill = parse(pd.Series([p.fill_value]), p)[0][0] if p.fill_value.strip() else np.zeros(0)
    if fill is None:
        raise ConfigError(
            f"input_features {feat.name!r}: preprocessing.fill_value {p.fill_value!r} is not a series of finite numbers; "
            "write one, or leave it empty for a series of padding"
        )
    keep = np.array([v is not None for v in values]) if p.missing_value_strategy == "drop_row" else None
    return padded([fill if v is None else v for v in values], length, p), keep


def padded(values: list[np.ndarray], length: int, p: Any) -> np.ndarray:
    """Each row's first ``length`` values, padded with ``p.padding_value`` on ``p.padding``'s side."""
    array = np.full((len(values), length), p.padding_value, dtype=np.float32)
    for r, v in enumerate(values):
        steps = v[:length]
        if p.padding == "right":
            array[r, : len(steps)] = steps
        elif len(steps):
            array[r, -len(steps) :] = steps
    return array


def encoder(feat: TimeseriesInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from raylight.declarative.models.encoders import sequence_encoder

    module = sequence_encoder(feat.encoder, None, meta["length"])
    return module, module.width

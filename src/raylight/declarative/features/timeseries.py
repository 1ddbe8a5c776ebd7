"""Timeseries features, as Ludwig's: each row a series of numbers (a cell of numbers split
by ``tokenizer``, or a list in Parquet or JSON), cut to the longest training row (at most
``timeseries_length_limit``) and padded with ``padding_value``; encoded by Ludwig's
default for them, ``parallel_cnn``, or any of text's other sequence encoders, over the
series as one channel (text's encoders without their embeddings, as Ludwig's timeseries
feature sets them), or Ludwig's forecasting encoders, ``nbeats`` (N-BEATS) and ``patchtst``
(PatchTST), from scratch (their modules: ``models/timeseries_encoders.py``). Values are
not scaled, as in Ludwig."""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import (
    Field,
    PlainValidator,
    SerializeAsAny,
    create_model,
    field_validator,
    model_validator,
)

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import (
    MAX_WIDTH,
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


class NBeatsEncoder(ConfigModel):
    """Ludwig's N-BEATS encoder (Oreshkin et al., 2020), its keys and defaults: ``num_stacks``
    stacks of ``num_blocks`` blocks, each ``num_layers`` fully connected layers of
    ``layer_size`` (ReLU, ``dropout``) then two linear heads: a backcast, subtracted from
    the series the next block reads (the residual), and a forecast of ``output_size``,
    the blocks' forecasts added up; then a linear layer of ``output_size``."""

    type: Literal["nbeats"] = Field(description="Ludwig's N-BEATS encoder.")
    num_stacks: int = Field(2, ge=1, le=64, description="Stacks of blocks.")
    num_blocks: int = Field(3, ge=1, le=64, description="Blocks per stack.")
    num_layers: int = Field(4, ge=1, le=64, description="Fully connected layers per block.")
    layer_size: int = Field(256, ge=1, le=MAX_WIDTH, description="Units of each block's layers.")
    output_size: int = Field(256, ge=1, le=MAX_WIDTH, description="Width of the blocks' forecasts and of the encoder's output.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after each of a block's layers.")


class PatchTSTEncoder(ConfigModel):
    """Ludwig's PatchTST encoder (Nie et al., 2023), its keys and defaults: the series cut
    into patches of ``patch_size`` steps every ``patch_stride`` steps, each projected to
    ``d_model`` with a learned position added, ``num_layers`` pre-norm transformer blocks
    (``num_heads`` heads, a feed-forward width of ``ffn_dim``, ``dropout``), a layer norm,
    the patches reduced (``reduce_output``), then a linear layer of ``output_size``. A
    series shorter than a patch is padded to one with its last value (Ludwig's unfold
    would fail)."""

    type: Literal["patchtst"] = Field(description="Ludwig's PatchTST encoder.")
    patch_size: int = Field(16, ge=1, le=65_536, description="Steps per patch.")
    patch_stride: int = Field(8, ge=1, le=65_536, description="Steps between the starts of two patches (below patch_size: overlapping).")
    d_model: int = Field(128, ge=1, le=MAX_WIDTH, description="Width of the transformer blocks (a multiple of num_heads).")
    num_heads: int = Field(8, ge=1, le=1024, description="Attention heads.")
    num_layers: int = Field(3, ge=1, le=64, description="Transformer blocks.")
    ffn_dim: int = Field(256, ge=1, le=MAX_WIDTH, description="Width of each block's feed-forward layer.")
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout in the blocks.")
    output_size: int = Field(256, ge=1, le=MAX_WIDTH, description="Width of the encoder's output.")
    reduce_output: Literal["mean", "last", "first"] = Field("mean", description="How the patches reduce to one vector.")

    @model_validator(mode="after")
    def _heads_fit(self) -> PatchTSTEncoder:
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model {self.d_model} is not a multiple of num_heads {self.num_heads}: each head takes "
                "d_model / num_heads of the width; change one of them"
            )
        return self


SeriesEncoder = TimeseriesEncoder | NBeatsEncoder | PatchTSTEncoder
_OWN_MODULE = frozenset({"nbeats", "patchtst"})  # the encoders of models/timeseries_encoders.py
_TYPES = (*typing.get_args(TimeseriesEncoder.model_fields["type"].annotation), *sorted(_OWN_MODULE))
_KIND = Literal[_TYPES]  # type: ignore[valid-type]  # built from the members' types
_EncoderType = create_model("TimeseriesEncoderType", type=(_KIND, Field(description="The encoder type.")))


def _series_encoder(value: Any) -> ConfigModel:
    """``value`` as the model of the encoder type it names (parallel_cnn, Ludwig's default,
    where it names none); an unknown type is pydantic's error at ``encoder.type``, the
    section's other errors at their keys."""
    if isinstance(value, SeriesEncoder):
        return value
    if not isinstance(value, dict):
        return TimeseriesEncoder.model_validate(value)  # pydantic's error for a value that is no mapping
    kind = _EncoderType.model_validate({"type": value.get("type", "parallel_cnn")}).type  # type: ignore[attr-defined]
    models: dict[str, type[ConfigModel]] = {"nbeats": NBeatsEncoder, "patchtst": PatchTSTEncoder}
    model = models.get(kind, TimeseriesEncoder)
    return model.model_validate(value)


class TimeseriesInput(FeatureModel):
    type: Literal["timeseries"]
    preprocessing: TimeseriesPreprocessing = Field(
        default_factory=lambda: TimeseriesPreprocessing(), description="Timeseries preprocessing."
    )
    encoder: Annotated[SerializeAsAny[SeriesEncoder], PlainValidator(_series_encoder)] = Field(
        default_factory=lambda: TimeseriesEncoder(),
        description="Timeseries encoder: parallel_cnn (default), text's other sequence encoders, nbeats, patchtst.",
    )


def retyped_encoder(section: dict[str, Any], kind: str) -> dict[str, Any]:
    """``section`` as a ``kind`` encoder for a search over encoder types: text's rule
    between the sequence encoders; nbeats and patchtst start from their own defaults."""
    if kind in _OWN_MODULE or section.get("type", "parallel_cnn") in _OWN_MODULE:
        return {"type": kind}
    return TimeseriesEncoder.retyped(section, kind)


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
    if feat.encoder.type in _OWN_MODULE:
        from raylight.declarative.models.timeseries_encoders import series_encoder

        own = series_encoder(feat.encoder, meta["length"])
        return own, own.width
    from raylight.declarative.models.encoders import sequence_encoder

    module = sequence_encoder(feat.encoder, None, meta["length"])
    return module, module.width

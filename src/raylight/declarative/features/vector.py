"""Vector features, as Ludwig's: each row a fixed number of floats (a CSV cell of numbers
separated by white space, or a list in Parquet or JSON), through fully connected layers
(Ludwig's ``dense`` encoder: one layer of 256 units by default) or as they are
(``passthrough``). Values are not scaled, as in Ludwig.

A vector output (regression of every float of the row, Ludwig's) goes through the same
functions: its ``vector_size`` is the output's own key (``_prep``), and a row without a
vector is dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

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
from raylight.declarative.layers import FCLayer, FCStackConfig

if TYPE_CHECKING:
    from torch import nn


class VectorPreprocessing(ConfigModel):
    vector_size: int | None = Field(
        None, ge=1, le=MAX_WIDTH, description="The floats in each row; null: the length the column's rows share."
    )
    missing_value_strategy: Literal["fill_with_const", "drop_row"] = Field(
        "fill_with_const", description="What replaces a missing vector: fill_value, or the row dropped."
    )
    fill_value: str = Field("", description="fill_with_const's vector, floats separated by spaces; empty: zeros.")


class VectorEncoder(FCStackConfig):
    """Ludwig's dense encoder: ``fc_layers`` (or Ludwig's ``num_layers`` x ``output_size``),
    one layer of 256 units by default; or ``passthrough``: the floats as they are."""

    LUDWIG_COUNT_KEY: ClassVar[str] = "num_layers"
    LUDWIG_COUNT: ClassVar[int] = 1

    type: Literal["dense", "passthrough"] = Field("dense", description="dense: fully connected layers; passthrough: none.")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=256)], max_length=64, description="The dense encoder's layers."
    )

    @model_validator(mode="after")
    def _passthrough_has_no_layers(self) -> VectorEncoder:
        if self.type == "passthrough" and "fc_layers" in self.model_fields_set and self.fc_layers:
            raise ValueError("a passthrough encoder has no layers: remove fc_layers, or use type: dense")
        return self


class VectorInput(FeatureModel):
    type: Literal["vector"]
    preprocessing: VectorPreprocessing = Field(default_factory=lambda: VectorPreprocessing(), description="Vector preprocessing.")
    encoder: VectorEncoder = Field(default_factory=lambda: VectorEncoder(), description="Vector encoder.")


Input = VectorInput
TARGET_MISSING = "drop_row"  # a vector output's rows without a vector (Ludwig's default for outputs)


def _is_input(feat: Any) -> bool:
    return isinstance(getattr(feat, "preprocessing", None), VectorPreprocessing)


def _prep(feat: Any) -> VectorPreprocessing:
    """An input's preprocessing, or an output's (which has only ``vector_size``)."""
    if _is_input(feat):
        return feat.preprocessing
    return VectorPreprocessing(vector_size=feat.vector_size, missing_value_strategy=TARGET_MISSING)


def _side(feat: Any) -> str:
    return "input_features" if _is_input(feat) else "output_features"


def _size_key(feat: Any) -> str:
    """Where the feature's vector_size is set, for messages."""
    return "preprocessing.vector_size" if _is_input(feat) else "vector_size"


INFER_RANK = 3  # after date, before text: "0.1 0.5 0.2 0.9" is four words
_INFER_SAMPLE = 1000


def parse(col: pd.Series) -> tuple[list[np.ndarray | None], np.ndarray]:
    """Each row's floats (None where missing or bad), and the mask of present rows that are
    not vectors of finite numbers."""
    return numbers(col, str.split)


def lengths(values: list[np.ndarray | None]) -> dict[int, int]:
    """The length of each row's vector, by row number (rows with one)."""
    return {r: len(v) for r, v in enumerate(values) if v is not None}


def infers(values: pd.Series) -> bool:
    """Text columns whose every value (of the first 1000) is two or more numbers separated
    by white space, all of one length."""
    if pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values) or values.empty:
        return False
    parsed, bad = parse(values.head(_INFER_SAMPLE))
    sizes = set(lengths(parsed).values())
    return not bad.any() and len(sizes) == 1 and sizes.pop() >= 2


def _not_vectors(kind: str, feat: Any, examples: list[str], where: str = "") -> ConfigError:
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type vector) holds values that are not vectors of finite "
        f"numbers, such as {examples}{where}; write each as numbers separated by spaces (or a list in Parquet or "
        "JSON), or leave the cell empty to treat it as missing"
    )


def _lengths_differ(kind: str, feat: Any, lengths: list[int], where: str = "") -> ConfigError:
    size, key = _prep(feat).vector_size, _size_key(feat)
    want = f"{key} is {size}" if size else "its rows must share one length"
    return ConfigError(
        f"column {feat.col!r} ({kind} {feat.name!r}, type vector) has vectors of {sorted(lengths)} numbers{where}, "
        f"but {want}; fix the rows, or set {key} to their length"
    )


def check(col: pd.Series, feat: Any, kind: str) -> None:
    values, bad = parse(col)
    if bad.any():
        raise _not_vectors(kind, feat, *bad_cells(col, bad))
    sizes = lengths(values)
    wanted = _prep(feat).vector_size or next(iter(sizes.values()), None)
    odd = next((r for r, n in sizes.items() if n != wanted), None)
    if odd is not None:
        raise _lengths_differ(kind, feat, list(set(sizes.values())), f" (row {col.index[odd]} has {sizes[odd]})")


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    """Bad values (how many, one example) and the lengths of the block's vectors."""
    values, bad = parse(col)
    return {**bad_summary(col, bad), "lengths": " ".join(map(str, sorted(set(lengths(values).values()))))}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    if int(summary["bad"].sum()):
        raise _not_vectors(kind, feat, examples(summary))
    lengths = sorted({int(n) for text in summary["lengths"] for n in str(text).split()})
    wanted = _prep(feat).vector_size
    if len(lengths) > 1 or (wanted and lengths and lengths != [wanted]):
        raise _lengths_differ(kind, feat, lengths)


def _size(feat: Any, lengths: set[int]) -> dict[str, Any]:
    size = _prep(feat).vector_size or (min(lengths) if lengths else 0)
    if not size:
        raise ConfigError(
            f"column {feat.col!r} (feature {feat.name!r}, type vector) has no vectors in the training split, so its "
            f"length is unknown; fill the column, set {_size_key(feat)}, or drop the feature"
        )
    return {"size": size}


def fit(col: pd.Series, feat: Any) -> dict[str, Any]:
    return _size(feat, set(lengths(parse(col)[0]).values()))


def fit_ray(train: Any, feats: list[Any]) -> dict[str, dict[str, Any]]:
    cols = sorted({f.col for f in feats})

    def block_lengths(df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame([{"col": c, "n": n} for c in cols for n in set(lengths(parse(df[c])[0]).values())] or [{"col": "", "n": 0}])

    table = train.map_batches(block_lengths, batch_format="pandas", batch_size=None).to_pandas()
    return {f.name: _size(f, set(table.loc[table["col"] == f.col, "n"].astype(int))) for f in feats}


def transform(col: pd.Series, feat: Any, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """An input's or an output's floats (rows x size) and, with drop_row, the rows kept."""
    p, size, side = _prep(feat), meta["size"], _side(feat)
    values, bad = parse(col)
    if bad.any():  # a dataset to predict on
        raise _not_vectors(side, feat, *bad_cells(col, bad))
    odd = next(((r, n) for r, n in lengths(values).items() if n != size), None)
    if odd is not None:
        raise _lengths_differ(side, feat, [odd[1]], f" (row {col.index[odd[0]]}); the model takes {size}")
    fill = numbers(pd.Series([p.fill_value]), str.split)[0][0] if p.fill_value.strip() else np.zeros(size)
    if fill is None or len(fill) != size:
        raise ConfigError(
            f"input_features {feat.name!r}: preprocessing.fill_value {p.fill_value!r} is not a vector of {size} finite "
            "numbers separated by spaces; write one, or leave it empty for zeros"
        )
    keep = np.array([v is not None for v in values]) if p.missing_value_strategy == "drop_row" else None
    array = np.stack([fill if v is None else v for v in values]) if len(values) else np.zeros((0, size))
    return array.astype(np.float32), keep


def encoder(feat: VectorInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    if feat.encoder.type == "passthrough":
        return nn.Identity(), meta["size"]
    from raylight.declarative.models.ecd import FCStack

    module = FCStack(feat.encoder, meta["size"])
    return module, module.width

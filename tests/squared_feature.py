"""A feature type that is not built in, for tests/declarative/test_features.py: a number whose
square, after an offset, is standardised and fed to a learned linear encoder. It is what
adding a type takes: this one module, and one entry in ``FEATURES`` (the test adds it
with monkeypatch)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.config.base import ConfigModel
from raylight.declarative.features import number
from raylight.declarative.features.base import FeatureModel


class SquaredPreprocessing(ConfigModel):
    offset: float = Field(0.0, description="Subtracted before squaring.")


class SquaredEncoder(ConfigModel):
    width: int = Field(2, ge=1, le=64, description="Outputs of the linear encoder.")


class SquaredInput(FeatureModel):
    type: Literal["squared"]
    preprocessing: SquaredPreprocessing = Field(default_factory=lambda: SquaredPreprocessing(), description="Offset.")
    encoder: SquaredEncoder = Field(default_factory=lambda: SquaredEncoder(), description="Linear encoder.")


Input = SquaredInput
INFER_RANK = 50


def infers(values: pd.Series) -> bool:
    return False  # only ever declared


def squares(col: pd.Series, feat: SquaredInput) -> pd.Series:
    return (pd.to_numeric(col, errors="coerce").astype(float) - feat.preprocessing.offset) ** 2


check = number.check  # a number column, as far as the data goes
block_summary = number.block_summary
check_blocks = number.check_blocks


def fit(col: pd.Series, feat: SquaredInput) -> dict[str, Any]:
    values = squares(col, feat).dropna()
    return {"mean": float(values.mean()), "std": float(values.std(ddof=0)) or 1.0}


def fit_ray(train: Any, feats: list[SquaredInput]) -> dict[str, dict[str, Any]]:
    df = train.to_pandas()
    return {feat.name: fit(df[feat.col], feat) for feat in feats}


def transform(col: pd.Series, feat: SquaredInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    values = (squares(col, feat).fillna(meta["mean"]) - meta["mean"]) / meta["std"]
    return values.to_numpy(dtype=np.float32)[:, None], None


def encoder(feat: SquaredInput, meta: dict[str, Any]) -> tuple[Any, int]:
    from torch import nn

    return nn.Linear(1, feat.encoder.width), feat.encoder.width

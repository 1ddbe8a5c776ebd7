"""Bag features, as Ludwig's: a set (``sets.py``) whose tokens count: the sum of the
embeddings of a row's known tokens, each weighted by how often it occurs in the row
(Ludwig's ``embed`` bag encoder, EmbedWeighted), then optional fully connected layers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.declarative.features import sets as set_type
from raylight.declarative.features.base import FeatureModel
from raylight.declarative.features.sets import SetEncoder, SetPreprocessing

if TYPE_CHECKING:
    from torch import nn


class BagEncoder(SetEncoder):
    force_embedding_size: bool = Field(
        False, description="Embeddings of embedding_size even where the vocabulary is smaller (Ludwig's)."
    )


class BagInput(FeatureModel):
    type: Literal["bag"]
    preprocessing: SetPreprocessing = Field(default_factory=lambda: SetPreprocessing(), description="Bag preprocessing.")
    encoder: BagEncoder = Field(default_factory=lambda: BagEncoder(), description="Bag encoder.")


Input = BagInput
INFER_RANK = 51  # claims no column, as set
infers, check, block_summary, check_blocks = set_type.infers, set_type.check, set_type.block_summary, set_type.check_blocks


def fit(col: pd.Series, feat: BagInput) -> dict[str, Any]:
    return set_type.fit_tokens(col, feat.preprocessing, counted=True)


def fit_ray(train: Any, feats: list[BagInput]) -> dict[str, dict[str, Any]]:
    return set_type.fit_tokens_ray(train, feats, counted=True)


def transform(col: pd.Series, feat: BagInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    return set_type.transform_tokens(col, feat, meta, counted=True)


def encoder(feat: BagInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    return set_type.token_encoder(feat.encoder, meta, counted=True)

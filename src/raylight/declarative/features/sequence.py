"""Sequence features, as Ludwig's: text with Ludwig's sequence defaults (tokens split on
white space, case kept, 256 kept per row) encoded by Ludwig's sequence default, ``embed``
(the sum of 256-wide token embeddings), or any of text's other encoders (parallel_cnn,
stacked_cnn, stacked_parallel_cnn, rnn, cnnrnn, transformer). The tokens, their vocabulary
and the encoders are text's (``text.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.declarative.features import text
from raylight.declarative.features.base import FeatureModel

if TYPE_CHECKING:
    from torch import nn


class SequencePreprocessing(text.TextPreprocessing):
    lowercase: bool = Field(False, description="Lower-case values before splitting them (Ludwig's default: no).")
    tokenizer: text.Tokenizer = Field("space", description="How a value splits into tokens (Ludwig's; default: on white space).")
    max_sequence_length: int = Field(256, ge=1, le=65_536, description="Tokens kept of each row, from its start.")


class SequenceEncoder(text.TextEncoder):
    embedding_size: int = Field(256, ge=1, le=65_536, description="Size of the token embeddings.")
    reduce_output: text.Reduce | None = Field(
        "sum", description="How the tokens reduce to one vector (rnn, cnnrnn, transformer: last); null: per step (sequence combiners)."
    )


class SequenceInput(FeatureModel):
    type: Literal["sequence"]
    preprocessing: SequencePreprocessing = Field(
        default_factory=lambda: SequencePreprocessing(), description="Sequence preprocessing."
    )
    encoder: SequenceEncoder = Field(default_factory=lambda: SequenceEncoder(), description="Sequence encoder.")


Input = SequenceInput
INFER_RANK = 52  # claims no column: a sequence reads as text
check, block_summary, check_blocks = text.check, text.block_summary, text.check_blocks


def infers(values: pd.Series) -> bool:
    return False


def fit(col: pd.Series, feat: SequenceInput) -> dict[str, Any]:
    return text.fit(col, feat)


def fit_ray(train: Any, feats: list[SequenceInput]) -> dict[str, dict[str, Any]]:
    return text.fit_ray(train, feats)


def transform(col: pd.Series, feat: SequenceInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    return text.transform(col, feat, meta)


def encoder(feat: SequenceInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    return text.encoder(feat, meta)

"""Text features: tokens (words by default, or Ludwig's tokenizers) from a vocabulary of
the training split's most common ones, the first ``max_sequence_length`` of each row,
encoded by a mean bag of embeddings."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import MAX_VOCAB, PAD, UNK, EmbeddingEncoder, FeatureModel

if TYPE_CHECKING:
    from torch import nn

TEXT_LENGTH = 64  # max_sequence_length's default (Ludwig's is 256)

Tokenizer = Literal["words", "space_punct", "space", "underscore", "comma", "characters"]
# Each tokenizer: text -> tokens. Ludwig's have Ludwig's meaning (ludwig.utils.tokenizers);
# "words", raylight's default, keeps the runs of word characters and drops punctuation.
_WORDS = re.compile(r"\w+")
_SPACE_PUNCT = re.compile(r"\w+|[^\w\s]")
_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {
    "words": _WORDS.findall,
    "space_punct": _SPACE_PUNCT.findall,
    "space": str.split,
    "underscore": lambda text: re.split(r"\s*_\s*", text.strip()),
    "comma": lambda text: re.split(r"\s*,\s*", text.strip()),
    "characters": list,
}


def tokenize(text: str, tp: Any) -> list[str]:
    """``text``'s tokens by the ``tokenizer`` and ``lowercase`` of ``tp`` (a text's, set's or
    bag's preprocessing)."""
    return _TOKENIZERS[tp.tokenizer](text.lower() if tp.lowercase else text)


class TextPreprocessing(ConfigModel):
    most_common: int = Field(20_000, ge=1, le=MAX_VOCAB, description="Largest vocabulary of tokens.")
    min_frequency: int = Field(1, ge=1, le=2**31, description="Rarer tokens map to <UNK>.")
    lowercase: bool = Field(True, description="Lower-case text before tokenising (Ludwig's default is false).")
    tokenizer: Tokenizer = Field(
        "words",
        description="words: runs of letters, digits and underscores (punctuation dropped); Ludwig's "
        "space_punct (words and each punctuation mark; its default), space (split on white space), "
        "underscore, comma, characters.",
    )
    max_sequence_length: int = Field(
        TEXT_LENGTH, ge=1, le=65_536, description="Tokens kept of each row, from its start (Ludwig's key; its default is 256)."
    )


class TextInput(FeatureModel):
    type: Literal["text"]
    preprocessing: TextPreprocessing = Field(default_factory=lambda: TextPreprocessing(), description="Text preprocessing.")
    encoder: EmbeddingEncoder = Field(default_factory=lambda: EmbeddingEncoder(), description="Bag-of-embeddings encoder.")


Input = TextInput
INFER_RANK = 4  # strings of more than three words on average (after date and vector)


def infers(values: pd.Series) -> bool:
    if pd.api.types.is_numeric_dtype(values):
        return False
    return bool(values.astype(str).str.split().str.len().mean() > 3)


def check(col: pd.Series, feat: Any, kind: str) -> None:
    return None  # any value is text


def block_summary(col: pd.Series) -> dict[str, Any]:
    return {}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    return None


def fit(col: pd.Series, feat: TextInput) -> dict[str, Any]:
    tp = feat.preprocessing
    counts = Counter(t for text in col.dropna().astype(str) for t in tokenize(text, tp))
    kept = [v for v, c in counts.most_common(tp.most_common) if c >= tp.min_frequency]
    return {"vocab": [PAD, UNK, *kept]}


def fit_ray(train: Any, feats: list[TextInput]) -> dict[str, dict[str, Any]]:
    meta: dict[str, dict[str, Any]] = {}
    for feat in feats:
        tp = feat.preprocessing

        def count_tokens(df: pd.DataFrame, col: str = feat.col, tp: TextPreprocessing = tp) -> pd.DataFrame:
            c = Counter(t for text in df[col].dropna().astype(str) for t in tokenize(text, tp))
            return pd.DataFrame({"token": list(c), "n": list(c.values())})

        tokens = train.map_batches(count_tokens, batch_format="pandas").to_pandas()
        totals = tokens.groupby("token")["n"].sum().sort_values(ascending=False)
        kept = [t for t, n in totals.items() if n >= tp.min_frequency][: tp.most_common]
        meta[feat.name] = {"vocab": [PAD, UNK, *kept]}
    return meta


def transform(col: pd.Series, feat: TextInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    index = {v: i for i, v in enumerate(meta["vocab"])}
    length = feat.preprocessing.max_sequence_length
    ids = np.zeros((len(col), length), dtype=np.int64)
    for r, text in enumerate(col.fillna("").astype(str)):
        tokens = [index.get(t, 1) for t in tokenize(text, feat.preprocessing)][:length]
        ids[r, : len(tokens)] = tokens
    return ids, None


def encoder(feat: TextInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    size = feat.encoder.embedding_size
    return nn.EmbeddingBag(len(meta["vocab"]), size, mode="mean", padding_idx=0), size

"""Text features: tokens (words by default, or Ludwig's tokenizers) from a vocabulary of
the training split's most common ones, the first ``max_sequence_length`` of each row in
order, encoded by a bag of embeddings (``embed``: their mean, raylight's default, or
Ludwig's sum or max) or Ludwig's default text encoder, ``parallel_cnn`` (convolutions of several widths over the
embedded tokens, reduced over the sequence, then fully connected layers)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from raylight.config.base import ConfigModel
from raylight.declarative.features.base import MAX_VOCAB, MAX_WIDTH, PAD, UNK, FeatureModel
from raylight.declarative.layers import FCStackConfig

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
    """``text``'s tokens by the ``tokenizer`` and ``lowercase`` (if it has one) of ``tp`` (a
    text's, sequence's, set's, bag's or timeseries' preprocessing)."""
    return _TOKENIZERS[tp.tokenizer](text.lower() if getattr(tp, "lowercase", False) else text)


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


class ConvLayer(ConfigModel):
    filter_size: int | None = Field(None, ge=1, le=1024, description="Width of this layer's filters; null: the encoder's.")
    num_filters: int | None = Field(None, ge=1, le=MAX_WIDTH, description="Filters (output channels); null: the encoder's.")


# The settings only parallel_cnn has, at their defaults; an embed encoder given another
# value is an error (the defaults: as a rendered config writes them).
_CNN_DEFAULTS: dict[str, Any] = {
    "conv_layers": [], "num_conv_layers": None, "filter_size": 3, "num_filters": 256, "pool_function": "max", "pool_size": None,
}
_CNN_KEYS = tuple(_CNN_DEFAULTS)
_LUDWIG_CONV = [{"filter_size": 2}, {"filter_size": 3}, {"filter_size": 4}, {"filter_size": 5}]  # ParallelCNN's
_LUDWIG_CNN_FC = [{"output_size": 512}, {"output_size": 256}]


class TextEncoder(FCStackConfig):
    """``embed`` (default): the tokens' embeddings reduced by ``reduce_output``; with no
    ``type`` given, their mean (raylight's default), and a ``type: embed`` without
    ``reduce_output`` is Ludwig's embed, their sum. ``parallel_cnn`` (Ludwig's default text encoder, ParallelCNN):
    the tokens embedded, convolutions of each width in ``conv_layers`` side by side ("same"
    padding, the activation, optional pooling), their channels reduced over the sequence by
    ``reduce_output``, then ``fc_layers``; Ludwig's defaults: widths 2, 3, 4 and 5 of 256
    filters, a sum, layers of 512 and 256, embeddings of 256. ``dropout`` drops out the
    embeddings, the convolutions' and the layers' outputs; ``norm`` applies to the layers."""

    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 256

    type: Literal["embed", "parallel_cnn"] = Field("embed", description="embed: a mean bag of embeddings; parallel_cnn: Ludwig's.")
    embedding_size: int = Field(32, ge=1, le=MAX_WIDTH, description="Size of the token embeddings (parallel_cnn's default: 256).")
    reduce_output: Literal["mean", "sum", "max"] = Field(
        "mean",
        description="How the tokens reduce to one vector: mean, sum or max (default: mean; Ludwig's sum where "
        "type: embed or parallel_cnn is given without it).",
    )
    conv_layers: list[ConvLayer] = Field(
        default_factory=list, max_length=64, description="parallel_cnn: the convolutions side by side (default: widths 2, 3, 4, 5)."
    )
    filter_size: int = Field(3, ge=1, le=1024, description="parallel_cnn: a convolution's width where its entry has none.")
    num_filters: int = Field(256, ge=1, le=MAX_WIDTH, description="parallel_cnn: a convolution's filters where its entry has none.")
    pool_function: Literal["max", "average", "avg", "mean"] = Field("max", description="parallel_cnn: pooling after each convolution.")
    pool_size: int | None = Field(None, ge=1, le=1024, description="parallel_cnn: the pooling's width and stride; null: no pooling.")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_defaults(cls, data: Any) -> Any:
        """Ludwig's defaults where the config names Ludwig's encoder and leaves them out
        (Ludwig writes null for some): an embed encoder sums, a parallel_cnn one too and
        has its own sizes."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in ("num_fc_layers", "num_conv_layers", "conv_layers", "fc_layers") and v is None)}
        if "type" in data:
            data.setdefault("reduce_output", "sum")
        if data.get("type") != "parallel_cnn":
            given = sorted(k for k in _CNN_KEYS if k in data and data[k] != _CNN_DEFAULTS[k])
            if given:
                raise ValueError(f"{', '.join(given)}: settings of the parallel_cnn encoder; add type: parallel_cnn or remove them")
            return data
        data.setdefault("embedding_size", 256)
        if "conv_layers" not in data:
            count = data.pop("num_conv_layers", None)
            data["conv_layers"] = _LUDWIG_CONV if count is None else [{}] * count
        else:
            data.pop("num_conv_layers", None)
        if "fc_layers" not in data and "num_fc_layers" not in data:
            data.pop("output_size", None)  # Ludwig: with neither, 512 and 256 whatever output_size says
            data["fc_layers"] = _LUDWIG_CNN_FC
        return data


class TextInput(FeatureModel):
    type: Literal["text"]
    preprocessing: TextPreprocessing = Field(default_factory=lambda: TextPreprocessing(), description="Text preprocessing.")
    encoder: TextEncoder = Field(default_factory=lambda: TextEncoder(), description="Text encoder.")


Input = TextInput
INFER_RANK = 4  # strings of more than three words on average (after date and vector)


def infers(values: pd.Series) -> bool:
    if pd.api.types.is_numeric_dtype(values):
        return False
    return bool(values.astype(str).str.split().str.len().mean() > 3)


def check(col: pd.Series, feat: Any, kind: str) -> None:
    return None  # any value is text


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    return {}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    return None


def fit(col: pd.Series, feat: Any) -> dict[str, Any]:
    tp = feat.preprocessing
    counts = Counter(t for text in col.dropna().astype(str) for t in tokenize(text, tp))
    kept = [v for v, c in counts.most_common(tp.most_common) if c >= tp.min_frequency]
    return {"vocab": [PAD, UNK, *kept]}


def fit_ray(train: Any, feats: list[Any]) -> dict[str, dict[str, Any]]:
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


def transform(col: pd.Series, feat: Any, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    index = {v: i for i, v in enumerate(meta["vocab"])}
    length = feat.preprocessing.max_sequence_length
    ids = np.zeros((len(col), length), dtype=np.int64)
    for r, text in enumerate(col.fillna("").astype(str)):
        tokens = [index.get(t, 1) for t in tokenize(text, feat.preprocessing)][:length]
        ids[r, : len(tokens)] = tokens
    return ids, None


def encoder(feat: Any, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    from torch import nn

    enc = feat.encoder
    from raylight.models.encoders import ParallelCNN, Then

    if enc.type == "parallel_cnn":
        cnn = ParallelCNN(enc, len(meta["vocab"]))
        return cnn, cnn.width
    bag = nn.EmbeddingBag(len(meta["vocab"]), enc.embedding_size, mode=enc.reduce_output, padding_idx=0)
    if not enc.fc_layers and enc.dropout == 0:  # the bag alone: weights files keep their names
        return bag, enc.embedding_size
    layered = Then(bag, enc, enc.embedding_size)
    return layered, layered.width

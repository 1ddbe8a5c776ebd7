"""Text features: tokens (words by default, or Ludwig's tokenizers) from a vocabulary of
the training split's most common ones, the first ``max_sequence_length`` of each row in
order, encoded by a bag of embeddings (``embed``: their mean, raylight's default, or
Ludwig's sum or max) or one of Ludwig's sequence encoders: ``parallel_cnn`` (its default
for text), ``stacked_cnn``, ``stacked_parallel_cnn``, ``rnn``, ``cnnrnn`` or ``transformer``
(``models/encoders.py``)."""

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
from raylight.declarative.layers import Activation, FCStackConfig

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
    pool_size: int | None = Field(
        None, ge=1, le=1024, description="Pooling after this layer (width and stride); absent: the encoder's; null: none."
    )


EncoderType = Literal["embed", "parallel_cnn", "stacked_cnn", "stacked_parallel_cnn", "rnn", "cnnrnn", "transformer"]
Reduce = Literal["mean", "sum", "max", "last"]
_CONV = frozenset({"parallel_cnn", "stacked_cnn", "stacked_parallel_cnn", "cnnrnn"})  # have convolutions
_LAYERED = frozenset({"parallel_cnn", "stacked_cnn", "cnnrnn"})  # ... listed in conv_layers
_RECURRENT = frozenset({"rnn", "cnnrnn"})
_PER_TOKEN = frozenset({"rnn", "cnnrnn", "transformer"})  # an output per step: reduce_output last, fc_* keys
# The settings only some encoder types have: the types, and the default (as a rendered
# config writes it). Another type given one of them at another value is an error.
_OWN: dict[str, tuple[frozenset[str], Any]] = {
    "conv_layers": (_LAYERED, []),
    "num_conv_layers": (_LAYERED, None),
    "filter_size": (_CONV, 3),
    "num_filters": (_CONV, 256),
    "pool_function": (_CONV, "max"),
    "pool_size": (_CONV, None),
    "stacked_layers": (frozenset({"stacked_parallel_cnn"}), []),
    "num_stacked_layers": (frozenset({"stacked_parallel_cnn"}), None),
    "conv_activation": (frozenset({"cnnrnn"}), "relu"),
    "conv_dropout": (frozenset({"cnnrnn"}), 0.0),
    "cell_type": (_RECURRENT, "rnn"),
    "state_size": (_RECURRENT, 256),
    "bidirectional": (_RECURRENT, False),
    "recurrent_dropout": (_RECURRENT, 0.0),
    "num_layers": (_PER_TOKEN, 1),
    "hidden_size": (frozenset({"transformer"}), 256),
    "num_heads": (frozenset({"transformer"}), 8),
    "transformer_output_size": (frozenset({"transformer"}), 256),
    "fc_dropout": (_PER_TOKEN, 0.0),
    "fc_activation": (_PER_TOKEN, "relu"),
}
_LUDWIG_CNN_FC = [{"output_size": 512}, {"output_size": 256}]
_WIDTHS_2_TO_5 = [{"filter_size": 2}, {"filter_size": 3}, {"filter_size": 4}, {"filter_size": 5}]
# Ludwig's layers where a config gives neither conv_layers nor num_conv_layers.
_LUDWIG_CONV = {
    "parallel_cnn": _WIDTHS_2_TO_5,
    "stacked_cnn": [
        {"filter_size": 7, "pool_size": 3}, {"filter_size": 7, "pool_size": 3}, {"filter_size": 3, "pool_size": None},
        {"filter_size": 3, "pool_size": None}, {"filter_size": 3, "pool_size": None}, {"filter_size": 3, "pool_size": 3},
    ],
    "cnnrnn": [{"pool_size": 3}, {"pool_size": None}],
}


def _with_pool(layers: list[Any], pool_size: Any) -> list[Any]:
    """``layers`` with ``pool_size`` written into each that has none (so a saved config says it)."""
    return [{"pool_size": pool_size, **layer} if isinstance(layer, dict) else layer for layer in layers]


def other_types_settings(encoder: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The keys of ``encoder`` (a text or sequence encoder section as written) that are
    other encoder types' settings, at values other than their defaults, and those types."""
    kind = encoder.get("type", "embed")
    given = sorted(k for k, (kinds, default) in _OWN.items() if kind not in kinds and k in encoder and encoder[k] != default)
    return given, sorted({t for k in given for t in _OWN[k][0]})


class TextEncoder(FCStackConfig):
    """``embed`` (default): the tokens' embeddings reduced by ``reduce_output``; with no
    ``type`` given, their mean (raylight's default), and a ``type: embed`` without
    ``reduce_output`` is Ludwig's embed, their sum. The others are Ludwig's, at Ludwig's
    defaults where the config names them (embeddings of 256, then):

    - ``parallel_cnn`` (Ludwig's default text encoder, ParallelCNN): convolutions of each
      width in ``conv_layers`` side by side ("same" padding, the activation, optional
      pooling), their channels reduced over the sequence, then ``fc_layers``; widths 2, 3,
      4 and 5 of 256 filters, a sum, layers of 512 and 256.
    - ``stacked_cnn`` (StackedCNN): the same convolutions one after another; six layers
      (widths 7, 7, 3, 3, 3, 3, pooling by 3 after the 1st, 2nd and 6th), a sum, layers of
      512 and 256.
    - ``stacked_parallel_cnn`` (StackedParallelCNN): ``stacked_layers``, each a list of
      convolutions side by side as parallel_cnn's, one after another; three of widths 2-5
      (``num_stacked_layers``: that many), the encoder's pooling after the last, a sum,
      layers of 512 and 256.
    - ``rnn`` (StackedRNN): ``num_layers`` recurrent layers of ``cell_type`` (rnn, lstm,
      gru) with ``state_size`` units, ``bidirectional`` optionally, then the output at
      each row's last token (``reduce_output: last``) and no layers.
    - ``cnnrnn`` (StackedCNNRNN): convolutions as stacked_cnn's (two of width 5, pooling
      by 3 after the first; ``conv_activation``, ``conv_dropout``), then recurrent layers
      as rnn's (Ludwig's ``num_rec_layers`` is ``num_layers``), the output at the last
      token, no layers.
    - ``transformer`` (StackedTransformer): token and position embeddings, projected to
      ``hidden_size`` if they differ, ``num_layers`` transformer blocks (``num_heads``
      heads, a feed-forward width of ``transformer_output_size``, dropout 0.1), the output
      at the last token, no layers. Padding is masked out of the attention.

    ``dropout`` drops out the embeddings, the convolutions' and the layers' outputs; for
    rnn, cnnrnn and transformer it drops out the embeddings (and the transformer blocks'
    parts), and the layers take ``fc_dropout`` and ``fc_activation`` (Ludwig's keys).
    ``norm`` applies to the layers."""

    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 256

    type: EncoderType = Field(
        "embed",
        description="embed: a mean bag of embeddings; Ludwig's parallel_cnn, stacked_cnn, stacked_parallel_cnn, rnn, "
        "cnnrnn, transformer.",
    )
    embedding_size: int = Field(32, ge=1, le=MAX_WIDTH, description="Size of the token embeddings (Ludwig's encoders: 256).")
    reduce_output: Reduce | None = Field(
        "mean",
        description="How the tokens reduce to one vector: mean, sum, max, or (rnn, cnnrnn, transformer) the output at each "
        "row's last token (default: mean; Ludwig's default for the type where a type is given); null: the outputs per "
        "step, for combiner type sequence_concat or sequence (not with embed).",
    )
    conv_layers: list[ConvLayer] = Field(
        default_factory=list, max_length=64, description="parallel_cnn, stacked_cnn, cnnrnn: the convolutions (default: Ludwig's)."
    )
    stacked_layers: list[list[ConvLayer]] = Field(
        default_factory=list, max_length=64,
        description="stacked_parallel_cnn: the stages, each convolutions side by side (default: Ludwig's three of widths 2-5).",
    )
    filter_size: int = Field(3, ge=1, le=1024, description="The CNN encoders: a convolution's width where its entry has none.")
    num_filters: int = Field(256, ge=1, le=MAX_WIDTH, description="The CNN encoders: a convolution's filters where its entry has none.")
    pool_function: Literal["max", "average", "avg", "mean"] = Field("max", description="The CNN encoders: the pooling.")
    pool_size: int | None = Field(
        None, ge=1, le=1024, description="The CNN encoders: the pooling's width and stride where an entry has none; null: none."
    )
    conv_activation: Activation = Field("relu", description="cnnrnn: the convolutions' activation.")
    conv_dropout: float = Field(0.0, ge=0, lt=1, description="cnnrnn: dropout after each convolution.")
    cell_type: Literal["rnn", "lstm", "gru"] = Field("rnn", description="rnn, cnnrnn: the recurrent cell (torch's RNN, LSTM or GRU).")
    state_size: int = Field(256, ge=1, le=MAX_WIDTH, description="rnn, cnnrnn: units of each recurrent layer (per direction).")
    bidirectional: bool = Field(False, description="rnn, cnnrnn: read each row both ways; the outputs are concatenated.")
    recurrent_dropout: float = Field(0.0, ge=0, lt=1, description="rnn, cnnrnn: dropout between the recurrent layers.")
    num_layers: int = Field(1, ge=1, le=64, description="rnn, cnnrnn, transformer: recurrent layers or transformer blocks.")
    hidden_size: int = Field(256, ge=1, le=MAX_WIDTH, description="transformer: width of the blocks (a multiple of num_heads).")
    num_heads: int = Field(8, ge=1, le=1024, description="transformer: attention heads.")
    transformer_output_size: int = Field(256, ge=1, le=MAX_WIDTH, description="transformer: width of each block's feed-forward layer.")
    fc_dropout: float = Field(0.0, ge=0, lt=1, description="rnn, cnnrnn, transformer: dropout after each of the layers.")
    fc_activation: Activation = Field("relu", description="rnn, cnnrnn, transformer: the layers' activation.")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_defaults(cls, data: Any) -> Any:
        """Ludwig's defaults where the config names Ludwig's encoder and leaves them out
        (Ludwig writes null for some), and each type's own settings kept to it."""
        if not isinstance(data, dict):
            return data
        nulls = ("num_fc_layers", "num_conv_layers", "conv_layers", "fc_layers", "num_stacked_layers", "stacked_layers")
        data = {k: v for k, v in data.items() if not (k in nulls and v is None)}
        kind = data.get("type", "embed")
        if "type" in data:
            data.setdefault("reduce_output", "last" if kind in _PER_TOKEN else "sum")
        if kind in _PER_TOKEN and data.get("activation") in ("relu", "tanh"):
            # raylight's default, which a saved config writes, and Ludwig's rnn's, which
            # reaches no layer there (torch's cells use tanh)
            del data["activation"]
        if kind in _PER_TOKEN and "activation" in data:
            raise ValueError(
                f"activation: the {kind} encoder's layers take fc_activation (Ludwig's key)"
                + ("; its convolutions take conv_activation" if kind == "cnnrnn" else "")
                + ("; its cells use tanh, as Ludwig's do whatever activation says" if kind in _RECURRENT else "")
            )
        if kind == "cnnrnn" and "num_rec_layers" in data:
            data["num_layers"] = data.pop("num_rec_layers")  # Ludwig's name of cnnrnn's recurrent layers
        given = sorted(k for k, (kinds, default) in _OWN.items() if kind not in kinds and k in data and data[k] != default)
        if given:
            owners = sorted({t for k in given for t in _OWN[k][0]})
            which = owners[0] + " encoder" if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]} encoders"
            raise ValueError(
                f"{', '.join(given)}: settings of the {which}; give the encoder "
                f"{'that type' if len(owners) == 1 else 'one of those types'} or remove them"
            )
        if kind == "embed":
            return data
        data.setdefault("embedding_size", 256)
        if kind == "transformer":
            data.setdefault("dropout", 0.1)
        if kind == "cnnrnn":
            data.setdefault("filter_size", 5)
        if kind in _LAYERED:
            count = data.pop("num_conv_layers", None)
            if "conv_layers" not in data:
                data["conv_layers"] = _LUDWIG_CONV[kind] if count is None else [{}] * count
            data["conv_layers"] = _with_pool(data["conv_layers"], data.get("pool_size"))
        if kind == "stacked_parallel_cnn":
            count = data.pop("num_stacked_layers", None)
            stages = data.get("stacked_layers") or [_WIDTHS_2_TO_5] * (3 if count is None else count)
            # Ludwig's: the encoder's pooling after the last stage, none after the others
            data["stacked_layers"] = [
                _with_pool(stage, data.get("pool_size") if i == len(stages) - 1 else None) if isinstance(stage, list) else stage
                for i, stage in enumerate(stages)
            ]
        if kind in _CONV - _RECURRENT and "fc_layers" not in data and "num_fc_layers" not in data:
            data.pop("output_size", None)  # Ludwig: with neither, 512 and 256 whatever output_size says
            data["fc_layers"] = _LUDWIG_CNN_FC
        return data

    @model_validator(mode="after")
    def _fits(self) -> TextEncoder:
        if self.reduce_output is None and self.type == "embed":
            raise ValueError(
                "reduce_output: null leaves an output per step, and embed gives one vector; use sum, mean or max, "
                "or an encoder with steps (parallel_cnn, stacked_cnn, rnn, transformer, ...)"
            )
        if self.reduce_output == "last" and self.type not in _PER_TOKEN:
            raise ValueError(
                f"reduce_output: last is for the rnn, cnnrnn and transformer encoders; with {self.type} use sum, mean or max"
            )
        side_by_side = [("conv_layers", self.conv_layers)] if self.type == "parallel_cnn" else []
        if self.type == "stacked_parallel_cnn":
            side_by_side = [(f"stacked_layers.{i}", stage) for i, stage in enumerate(self.stacked_layers)]
        for where, layers in side_by_side:
            pools = {layer.pool_size for layer in layers}
            if len(pools) > 1:
                raise ValueError(
                    f"{where}: convolutions side by side are concatenated step by step, so they take one pool_size; "
                    f"these take {sorted(pools, key=str)}: give them one"
                )
        if self.type == "transformer" and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}: each head takes "
                "hidden_size / num_heads of the width; change one of them"
            )
        return self

    @classmethod
    def retyped(cls, section: dict[str, Any], kind: str) -> dict[str, Any]:
        """``section`` (an encoder as a saved config writes it, every key) as a ``kind``
        encoder: the settings it changed from its own type's defaults that ``kind`` has too,
        and ``kind``'s defaults for the rest. A search over encoder types (hyperopt's
        ``review.encoder.type``) so trains each type as Ludwig configures it, with the
        config's embedding_size, dropout, ... where it set them."""
        own = section.get("type", "embed")
        defaults = cls.model_validate({"type": own} if own != "embed" else {}).model_dump(mode="json")
        changed = {k: v for k, v in section.items() if k != "type" and (k not in defaults or defaults[k] != v)}
        return {"type": kind, **{k: v for k, v in changed.items() if k not in _OWN or kind in _OWN[k][0]}}

    def layers(self) -> TextEncoder:
        """The settings of the layers after the sequence is reduced: rnn's, cnnrnn's and
        transformer's take fc_dropout and fc_activation (Ludwig's), the others dropout and
        activation."""
        if self.type not in _PER_TOKEN:
            return self
        return self.model_copy(update={"dropout": self.fc_dropout, "activation": self.fc_activation})


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

    from raylight.declarative.models.encoders import Then, sequence_encoder

    enc = feat.encoder
    if enc.type != "embed":
        module = sequence_encoder(enc, len(meta["vocab"]), feat.preprocessing.max_sequence_length)
        return module, module.width
    bag = nn.EmbeddingBag(len(meta["vocab"]), enc.embedding_size, mode=enc.reduce_output, padding_idx=0)
    if not enc.fc_layers and enc.dropout == 0:  # the bag alone: weights files keep their names
        return bag, enc.embedding_size
    layered = Then(bag, enc, enc.embedding_size)
    return layered, layered.width

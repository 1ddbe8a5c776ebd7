"""Set features, as Ludwig's: each row a set of tokens (split by ``tokenizer``, Ludwig's
``space`` by default), encoded by the sum of the embeddings of its tokens that the
training split's vocabulary holds (Ludwig's ``embed`` set encoder), then optional fully
connected layers (the ``set`` type). ``bag.py`` is the same with each token weighted by its count.

A row becomes the vocabulary indices of its known tokens, padded with 0 (``<UNK>``, whose
embedding is not added, as in Ludwig, where unknown tokens add nothing) to the most
distinct tokens any training row has; a row of another split with more known tokens
keeps its most common ones.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.base.exceptions import ConfigError
from raylight.config.base import ConfigModel
from raylight.declarative.features.base import MAX_VOCAB, MAX_WIDTH, UNK, FeatureModel, present
from raylight.declarative.features.text import Tokenizer, tokenize
from raylight.declarative.layers import FCStackConfig

if TYPE_CHECKING:
    from torch import nn


class SetPreprocessing(ConfigModel):
    tokenizer: Tokenizer = Field("space", description="How a value splits into tokens (Ludwig's; default: on white space).")
    lowercase: bool = Field(False, description="Lower-case values before splitting them.")
    most_common: int = Field(10_000, ge=1, le=MAX_VOCAB, description="Largest vocabulary of tokens; the rest are unknown.")
    missing_value_strategy: Literal["fill_with_const", "drop_row"] = Field(
        "fill_with_const", description="What replaces a missing value: fill_value's tokens, or the row dropped."
    )
    fill_value: str = Field(UNK, description="The value fill_with_const puts in a missing one (<UNK>: no tokens).")


class SetEncoder(FCStackConfig):
    """Ludwig's embed encoder: the sum of the tokens' embeddings, dropped out with
    ``dropout``, then ``fc_layers`` (or Ludwig's ``num_fc_layers`` x ``output_size``), none
    by default as in Ludwig."""

    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 10

    type: Literal["embed"] = Field("embed", description="The sum of the tokens' embeddings (Ludwig's embed).")
    embedding_size: int = Field(
        50, ge=1, le=MAX_WIDTH, description="Size of the embeddings; as in Ludwig, at most the vocabulary's size."
    )


class SetInput(FeatureModel):
    type: Literal["set"]
    preprocessing: SetPreprocessing = Field(default_factory=lambda: SetPreprocessing(), description="Set preprocessing.")
    encoder: SetEncoder = Field(default_factory=lambda: SetEncoder(), description="Set encoder.")


Input = SetInput
INFER_RANK = 50  # claims no column: a set of tokens reads as text or a category


def infers(values: pd.Series) -> bool:
    return False


def check(col: pd.Series, feat: Any, kind: str) -> None:
    return None  # any value is a set of tokens


def block_summary(col: pd.Series, feat: Any) -> dict[str, Any]:
    return {}


def check_blocks(summary: pd.DataFrame, feat: Any, kind: str) -> None:
    return None


# -- shared with bag.py: ``counted`` is whether a token's count in a row matters ---------
def rows(col: pd.Series, p: Any) -> list[list[str]]:
    """Each row's tokens (a list value's items as they are); a missing value's are
    fill_value's."""
    fill = tokenize(p.fill_value, p) if p.fill_value != UNK else []
    out = []
    for value, here in zip(col.astype(object), present(col), strict=True):
        if not here:
            out.append(fill)
        elif isinstance(value, list | tuple | np.ndarray):
            out.append([str(v) for v in value])
        else:
            out.append(tokenize(str(value), p))
    return out


def count_tokens(tokens: list[list[str]], counted: bool) -> tuple[Counter[str], int]:
    """How often each token occurs (in how many rows, for a set), and the most distinct
    tokens of one row."""
    counts: Counter[str] = Counter()
    width = 0
    for row in tokens:
        distinct = set(row)
        counts.update(row if counted else distinct)
        width = max(width, len(distinct))
    return counts, width


def vocabulary(counts: Counter[str], p: Any, width: int) -> dict[str, Any]:
    kept = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: p.most_common] if t != UNK]
    return {"vocab": [UNK, *kept], "width": max(width, 1)}


def fit_tokens(col: pd.Series, p: Any, counted: bool) -> dict[str, Any]:
    """The vocabulary and width from the training split's column, by preprocessing ``p``."""
    kept = col if p.missing_value_strategy != "drop_row" else col[present(col)]
    counts, width = count_tokens(rows(kept, p), counted)
    return vocabulary(counts, p, width)


def fit_tokens_ray(train: Any, feats: list[Any], counted: bool) -> dict[str, dict[str, Any]]:
    """One pass over the split for all the features: each block's token counts and widest
    row (one task per block), summed here; the vocabulary as ``fit`` makes it."""
    specs = [(f.name, f.col, f.preprocessing) for f in feats]

    def partial(df: pd.DataFrame) -> pd.DataFrame:
        parts = []
        for name, c, p in specs:
            kept = df[c] if p.missing_value_strategy != "drop_row" else df[c][present(df[c])]
            counts, width = count_tokens(rows(kept, p), counted)
            parts.append(pd.DataFrame({"name": name, "token": [*counts, ""], "n": [*counts.values(), 0], "width": width}))
        return pd.concat(parts, ignore_index=True)

    table = train.map_batches(partial, batch_format="pandas", batch_size=None).to_pandas()
    meta = {}
    for feat in feats:
        own = table[table["name"] == feat.name]
        counts = Counter({t: int(n) for t, n in own.groupby("token")["n"].sum().items() if n > 0})
        meta[feat.name] = vocabulary(counts, feat.preprocessing, int(own["width"].max()))
    return meta


def transform_tokens(col: pd.Series, feat: Any, meta: dict[str, Any], counted: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row's known tokens as vocabulary indices, most common first, padded with 0 to
    ``width`` (int64); counted: the indices, then their counts (float32, 2 x width)."""
    p = feat.preprocessing
    keep = present(col) if p.missing_value_strategy == "drop_row" else None
    index = {v: i for i, v in enumerate(meta["vocab"]) if i}
    width = meta["width"]
    ids = np.zeros((len(col), width), dtype=np.int64)
    counts = np.zeros((len(col), width), dtype=np.float32)
    for r, row in enumerate(rows(col, p)):
        known = sorted(Counter(index[t] for t in row if t in index).items())[:width]
        if known:
            ids[r, : len(known)], counts[r, : len(known)] = zip(*known, strict=True)
    return (np.concatenate([ids.astype(np.float32), counts], axis=1), keep) if counted else (ids, keep)


def token_encoder(enc: Any, meta: dict[str, Any], counted: bool) -> tuple[nn.Module, int]:
    """Ludwig's embed encoder of a set (the sum of the known tokens' embeddings) or a bag
    (``counted``: weighted by their counts), of at most the vocabulary's size unless a
    bag's ``force_embedding_size``, then the encoder's layers."""
    from torch import nn

    from raylight.declarative.models.encoders import Then, WeightedBag

    forced = getattr(enc, "force_embedding_size", False)
    size = enc.embedding_size if forced else min(enc.embedding_size, len(meta["vocab"]))
    bag = (WeightedBag if counted else nn.EmbeddingBag)(len(meta["vocab"]), size, mode="sum", padding_idx=0)
    module = Then(bag, enc, size)
    return module, module.width


# -- the set type ------------------------------------------------------------------------
def fit(col: pd.Series, feat: SetInput) -> dict[str, Any]:
    return fit_tokens(col, feat.preprocessing, counted=False)


def fit_ray(train: Any, feats: list[SetInput]) -> dict[str, dict[str, Any]]:
    return fit_tokens_ray(train, feats, counted=False)


def transform(col: pd.Series, feat: SetInput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    return transform_tokens(col, feat, meta, counted=False)


def encoder(feat: SetInput, meta: dict[str, Any]) -> tuple[nn.Module, int]:
    return token_encoder(feat.encoder, meta, counted=False)


# -- a set target (an output feature of type set: multi-label classification) --------------
# Ludwig's output preprocessing, which a set target takes as it is (its other values are
# refused by ``ludwig.FEATURE_KEYS``): split on white space, case kept, the 10,000 most
# common labels, rows with no labels dropped.
TARGET = SetPreprocessing(missing_value_strategy="drop_row")


def _target_classes(vocab: dict[str, Any], out: Any) -> dict[str, Any]:
    classes = vocab["vocab"][1:]
    if not classes:
        raise ConfigError(
            f"target column {out.col!r} (set) has no labels in the training split; fill it with labels "
            "separated by spaces, or choose another target"
        )
    return {"classes": classes}


def fit_target(col: pd.Series, out: Any) -> dict[str, Any]:
    """A set target's labels (``classes``), most common first, from the training split."""
    return _target_classes(fit_tokens(col, TARGET, counted=False), out)


def fit_target_ray(train: Any, out: Any) -> dict[str, Any]:
    as_input = SimpleNamespace(name=out.name, col=out.col, preprocessing=TARGET)  # what fit_tokens_ray reads
    return _target_classes(fit_tokens_ray(train, [as_input], counted=False)[out.name], out)


def target_array(col: pd.Series, classes: list[str]) -> np.ndarray:
    """Each row's labels as a multi-hot row over ``classes`` (float32; unknown labels: none)."""
    index = {c: i for i, c in enumerate(classes)}
    array = np.zeros((len(col), len(classes)), dtype=np.float32)
    for r, row in enumerate(rows(col, TARGET)):
        array[r, [index[t] for t in row if t in index]] = 1.0
    return array

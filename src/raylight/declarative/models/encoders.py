"""The input encoders that are more than one torch layer: a date's (Ludwig's DateEmbed and
DateWave), Ludwig's sequence encoders for text, sequences and timeseries (ParallelCNN,
StackedCNN, StackedRNN, StackedTransformer), and embeddings followed by layers
(a set's and a bag's, Ludwig's embed encoders; text's bag with layers). Their feature types
(``raylight.declarative.features``) import this module only when a model is built."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from raylight.declarative.features.date import CYCLES, DAY_S, SECOND_OF_DAY, YEAR
from raylight.declarative.models.ecd import FCStack

# torch's note that "same" padding of an even-width convolution (Ludwig's parallel_cnn has
# widths 2 and 4) copies its input: a fact of that padding, not something a user can act on.
warnings.filterwarnings("ignore", message="Using padding='same' with even kernel lengths", category=UserWarning)
# DDP's note that a gradient's strides differ from its bucket's, which a convolution over a
# timeseries' one channel gives once per worker: the weight's (filters, 1, width) has a
# dimension of size 1, whose stride means nothing, so nothing is copied or slowed.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides", category=UserWarning)


def _dropout(p: float) -> nn.Module:
    """Dropout of ``p``, or nothing where it is 0 (weights files and module listings stay
    as they were without it)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class DateModule(nn.Module):
    """The year (standardised by the training split's) through a linear unit, each cyclic
    part embedded (embed) or as the cosine of its value over its period (wave, Ludwig's
    ``periodic``), the second of the day as a cosine; concatenated, dropped out with the
    encoder's dropout, then the encoder's layers (none by default)."""

    def __init__(self, enc: Any, year_mean: float, year_std: float) -> None:
        super().__init__()
        self.year_mean, self.year_std, self.wave = float(year_mean), float(year_std), enc.type == "wave"
        self.year = nn.Linear(1, 1)
        self.embed = nn.ModuleDict(
            {} if self.wave else {name: nn.Embedding(size, enc.embedding_size) for name, size, _, _ in CYCLES}
        )
        width = 1 + len(CYCLES) * (1 if self.wave else enc.embedding_size) + 1
        self.dropout = _dropout(enc.dropout)
        self.fc = FCStack(enc, width)
        self.width = self.fc.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        year = (x[:, YEAR : YEAR + 1].float() - self.year_mean) / self.year_std
        parts = [self.year(year)]
        for name, size, column, first in CYCLES:
            value = x[:, column]
            if self.wave:
                parts.append(torch.cos(value[:, None].float() * (2 * math.pi / size)))
            else:
                parts.append(self.embed[name](value - first))
        parts.append(torch.cos(x[:, SECOND_OF_DAY : SECOND_OF_DAY + 1].float() * (2 * math.pi / DAY_S)))
        return self.fc(self.dropout(torch.cat(parts, dim=1)))


class WeightedBag(nn.EmbeddingBag):
    """A bag's embeddings (Ludwig's EmbedWeighted): a row is its tokens' indices, then their
    counts, and the embeddings are summed weighted by the counts (index 0 adds nothing)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        width = x.shape[1] // 2
        return super().forward(x[:, :width].long(), per_sample_weights=x[:, width:])


class Then(nn.Module):
    """An encoder's embeddings (``embed``: text's bag, a set's or a bag's sum) dropped out
    with the encoder config's dropout, then its layers (none by default for sets and bags)."""

    def __init__(self, embed: nn.Module, enc: Any, width: int) -> None:
        super().__init__()
        self.embed = embed
        self.dropout = _dropout(enc.dropout)
        self.fc = FCStack(enc, width)
        self.width = self.fc.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.embed(x)))


def _pool(enc: Any, size: int | None) -> nn.Module:
    if size is None:
        return nn.Identity()
    return (nn.MaxPool1d if enc.pool_function == "max" else nn.AvgPool1d)(size, ceil_mode=True)


def _conv(enc: Any, layer: Any, channels: int) -> nn.Conv1d:
    """One of ``conv_layers`` (or a stage's) over ``channels``: its own width and filters
    or the encoder's, "same" padding."""
    return nn.Conv1d(channels, layer.num_filters or enc.num_filters, layer.filter_size or enc.filter_size,
                     padding="same", bias=enc.use_bias)


def _pooled(lengths: torch.Tensor | None, size: int | None) -> torch.Tensor | None:
    """Each row's steps up to its last token after a pooling of ``size`` (ceil mode: a
    partial window counts)."""
    if lengths is None or size is None:
        return lengths
    return torch.div(lengths + size - 1, size, rounding_mode="floor")


class _Sequence(nn.Module):
    """What Ludwig's sequence encoders share: the tokens embedded (padding embeds to zeros)
    and dropped out, or a series of numbers as one channel (Ludwig's timeseries, which does
    not embed); then, from the encoder's outputs per step, their reduction over the steps
    (``reduce_output``; ``last``: the output at each row's last token) and the layers.
    With ``reduce_output: null`` the outputs per step are what a sequence combiner reads
    (``steps``): no layers, as Ludwig's. Given ``channels``, the input is already a
    sequence of that many channels per step (the sequence combiner's), not embedded."""

    def __init__(self, enc: Any, vocab_size: int | None, channels: int | None = None) -> None:
        super().__init__()
        self.embed = None if vocab_size is None else nn.Embedding(vocab_size, enc.embedding_size, padding_idx=0)
        self.channels = channels or (1 if vocab_size is None else enc.embedding_size)
        self.dropout = _dropout(enc.dropout)
        self.reduce = enc.reduce_output

    def _layers(self, enc: Any, width: int) -> None:
        self.fc: nn.Module = FCStack(enc.layers(), width) if self.reduce is not None else nn.Identity()
        self.width = self.fc.width if isinstance(self.fc, FCStack) else width

    def tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(rows, steps, channels)."""
        if ids.dim() == 3:
            return ids
        return ids[:, :, None].float() if self.embed is None else self.dropout(self.embed(ids))

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The outputs per step (rows, steps, width) and each row's steps up to its last
        token (None: all count)."""
        raise NotImplementedError

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.finish(*self.steps(ids))

    def lengths(self, ids: torch.Tensor) -> torch.Tensor | None:
        """Each row's steps up to its last token (text pads on the right; at least 1);
        None for a series, whose steps all count."""
        return None if self.embed is None else (ids != 0).sum(1).clamp(min=1)

    def finish(self, h: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``h``: (rows, steps, channels) -> the layers' output, reduced over each row's
        first ``lengths`` steps (None: all). An rnn's and a transformer's outputs are per
        token and give lengths; a convolution's mix neighbouring steps, and all count."""
        if self.reduce == "last":
            return self.fc(h[:, -1] if lengths is None else h[torch.arange(h.shape[0], device=h.device), lengths - 1])
        if lengths is not None:
            real = (torch.arange(h.shape[1], device=h.device)[None, :] < lengths[:, None])[:, :, None]
            h = h.masked_fill(~real, float("-inf") if self.reduce == "max" else 0.0)
        if self.reduce == "max":
            return self.fc(h.amax(1))
        reduced = h.sum(1)
        if self.reduce == "mean":
            reduced = reduced / (lengths[:, None] if lengths is not None else h.shape[1])
        return self.fc(reduced)


class ParallelCNN(_Sequence):
    """Ludwig's ParallelCNN: each convolution of ``conv_layers`` over the embedded tokens
    side by side ("same" padding, the activation, dropout, optional pooling), their
    channels concatenated and reduced over the sequence, then the encoder's layers."""

    def __init__(self, enc: Any, vocab_size: int | None, channels: int | None = None) -> None:
        """``vocab_size`` None: the input is a series of numbers, one channel."""
        from raylight.declarative.models.ecd import ACTIVATIONS

        super().__init__(enc, vocab_size, channels)
        self.convs = nn.ModuleList(_conv(enc, layer, self.channels) for layer in enc.conv_layers)
        self.pools = nn.ModuleList(_pool(enc, layer.pool_size) for layer in enc.conv_layers)
        self.activation = ACTIVATIONS[enc.activation]()
        self._layers(enc, sum(layer.num_filters or enc.num_filters for layer in enc.conv_layers))

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.tokens(ids).transpose(1, 2)  # (rows, channels, steps)
        h = torch.cat([pool(self.dropout(self.activation(conv(x)))) for conv, pool in zip(self.convs, self.pools, strict=True)], dim=1)
        return h.transpose(1, 2), None


class StackedCNN(_Sequence):
    """Ludwig's StackedCNN: the convolutions of ``conv_layers`` one after another (each:
    "same" padding, the activation, dropout, its pooling), reduced over what is left of
    the sequence, then the encoder's layers. With ``recurrent`` (Ludwig's StackedCNNRNN,
    cnnrnn) the convolutions take ``conv_activation`` and ``conv_dropout``, and recurrent
    layers as ``Recurrent``'s read their output, each row up to its last token's step."""

    def __init__(self, enc: Any, vocab_size: int | None, recurrent: bool = False, channels: int | None = None) -> None:
        from raylight.declarative.models.ecd import ACTIVATIONS

        super().__init__(enc, vocab_size, channels)
        convs, width = [], self.channels
        for layer in enc.conv_layers:
            convs.append(_conv(enc, layer, width))
            width = convs[-1].out_channels
        self.convs = nn.ModuleList(convs)
        self.pools = nn.ModuleList(_pool(enc, layer.pool_size) for layer in enc.conv_layers)
        self.pool_sizes = [layer.pool_size for layer in enc.conv_layers]
        self.activation = ACTIVATIONS[enc.conv_activation if recurrent else enc.activation]()
        self.conv_dropout = _dropout(enc.conv_dropout) if recurrent else self.dropout
        self.rnn = _recurrent_layers(enc, width) if recurrent else None
        self._layers(enc, width if self.rnn is None else enc.state_size * (2 if enc.bidirectional else 1))

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, lengths = self.tokens(ids).transpose(1, 2), self.lengths(ids)
        for conv, pool, size in zip(self.convs, self.pools, self.pool_sizes, strict=True):
            h, lengths = pool(self.conv_dropout(self.activation(conv(h)))), _pooled(lengths, size)
        if self.rnn is None:
            return h.transpose(1, 2), None
        return _recur(self.rnn, h.transpose(1, 2), lengths), lengths


class StackedParallelCNN(_Sequence):
    """Ludwig's StackedParallelCNN: stages one after another, each convolutions side by
    side as ParallelCNN's (their channels concatenated, then the stage's pooling), reduced
    over the sequence, then the encoder's layers."""

    def __init__(self, enc: Any, vocab_size: int | None, channels: int | None = None) -> None:
        from raylight.declarative.models.ecd import ACTIVATIONS

        super().__init__(enc, vocab_size, channels)
        stages, width = [], self.channels
        for stage in enc.stacked_layers:
            stages.append(nn.ModuleList(_conv(enc, layer, width) for layer in stage))
            width = sum(conv.out_channels for conv in stages[-1])
        self.stages = nn.ModuleList(stages)
        self.pools = nn.ModuleList(_pool(enc, stage[0].pool_size if stage else None) for stage in enc.stacked_layers)
        self.activation = ACTIVATIONS[enc.activation]()
        self._layers(enc, width)

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.tokens(ids).transpose(1, 2)
        for convs, pool in zip(self.stages, self.pools, strict=True):
            stage: nn.ModuleList = convs  # type: ignore[assignment]  # ModuleList's iteration is not typed
            h = pool(torch.cat([self.dropout(self.activation(conv(h))) for conv in stage], dim=1))
        return h.transpose(1, 2), None


_CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def _recurrent_layers(enc: Any, channels: int) -> nn.RNNBase:
    return _CELLS[enc.cell_type](
        channels, enc.state_size, num_layers=enc.num_layers, bias=enc.use_bias, batch_first=True,
        dropout=enc.recurrent_dropout if enc.num_layers > 1 else 0.0, bidirectional=enc.bidirectional,
    )


def _recur(rnn: nn.RNNBase, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """``rnn``'s outputs over ``x`` (rows, steps, channels), each row read up to its
    ``lengths`` (packed: its padding is not read; zeros there), or whole where None."""
    if lengths is None:
        return rnn(x)[0]
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=x.shape[1])[0]


class Recurrent(_Sequence):
    """Ludwig's StackedRNN: torch's RNN, LSTM or GRU (``cell_type``), ``num_layers`` deep,
    one or both ways, over each row's tokens (packed, so a row's padding is not read), then
    the reduction over them (by default the output at the last token) and the layers."""

    def __init__(self, enc: Any, vocab_size: int | None, channels: int | None = None) -> None:
        super().__init__(enc, vocab_size, channels)
        self.rnn = _recurrent_layers(enc, self.channels)
        self._layers(enc, enc.state_size * (2 if enc.bidirectional else 1))

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        lengths = self.lengths(ids)
        return _recur(self.rnn, self.tokens(ids), lengths), lengths


class Transformer(_Sequence):
    """Ludwig's StackedTransformer: token embeddings plus learned position embeddings
    (dropped out), projected to ``hidden_size`` where the widths differ, then
    ``num_layers`` of torch's post-norm transformer blocks (Ludwig's: ReLU feed-forward,
    layer-norm epsilon 1e-6), with the padding masked out of the attention; then the
    reduction over the tokens (by default the output at the last one) and the layers. A
    series of numbers is projected first and then given its positions (Ludwig's gives none)."""

    def __init__(self, enc: Any, vocab_size: int | None, length: int, channels: int | None = None) -> None:
        super().__init__(enc, vocab_size, channels)
        width = enc.hidden_size
        self.position = nn.Embedding(length, self.channels if self.embed is not None else width)
        self.project = nn.Linear(self.channels, width) if self.channels != width else nn.Identity()
        block = nn.TransformerEncoderLayer(
            width, enc.num_heads, enc.transformer_output_size, enc.dropout, batch_first=True, layer_norm_eps=1e-6
        )
        self.blocks = nn.TransformerEncoder(block, enc.num_layers, enable_nested_tensor=False)
        self._layers(enc, width)

    def steps(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = self.position(torch.arange(ids.shape[1], device=ids.device))
        if self.embed is None:
            x, padding = self.project(self.tokens(ids)) + positions, None
        else:
            x = self.project(self.tokens(ids) + positions)
            padding = ids == 0
            padding[:, 0] = False  # a row of no tokens attends to its first step, not to nothing
        return self.blocks(x, src_key_padding_mask=padding), self.lengths(ids)


def sequence_encoder(enc: Any, vocab_size: int | None, length: int, channels: int | None = None) -> _Sequence:
    """The module for a text, sequence or timeseries encoder other than embed: tokens from
    a vocabulary of ``vocab_size`` (None: a series of numbers, or given ``channels``, a
    sequence of that many per step), ``length`` steps per row."""
    if enc.type == "transformer":
        return Transformer(enc, vocab_size, length, channels=channels)
    if enc.type == "cnnrnn":
        return StackedCNN(enc, vocab_size, recurrent=True, channels=channels)
    kinds: dict[str, Any] = {"parallel_cnn": ParallelCNN, "stacked_cnn": StackedCNN, "stacked_parallel_cnn": StackedParallelCNN, "rnn": Recurrent}
    return kinds[enc.type](enc, vocab_size, channels=channels)


class OneHot(nn.Module):
    """Ludwig's sparse category encoder: each value's one-hot vector over the vocabulary
    (no parameters)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(ids, self.size).float()

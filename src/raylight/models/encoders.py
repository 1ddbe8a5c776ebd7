"""The input encoders that are more than one torch layer: a date's (Ludwig's DateEmbed and
DateWave), text's parallel_cnn (Ludwig's ParallelCNN), and embeddings followed by layers
(a set's and a bag's, Ludwig's embed encoders; text's bag with layers). Their feature types
(``raylight.declarative.features``) import this module only when a model is built."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from raylight.declarative.features.date import CYCLES, DAY_S, SECOND_OF_DAY, YEAR
from raylight.models.ecd import FCStack


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
        self.dropout = nn.Dropout(enc.dropout) if enc.dropout > 0 else nn.Identity()
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
        self.dropout = nn.Dropout(enc.dropout) if enc.dropout > 0 else nn.Identity()
        self.fc = FCStack(enc, width)
        self.width = self.fc.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.embed(x)))


class ParallelCNN(nn.Module):
    """Ludwig's ParallelCNN text encoder: the tokens embedded (padding embeds to zeros),
    each convolution of ``conv_layers`` over them side by side ("same" padding, the
    activation, dropout, optional pooling), their channels concatenated and reduced over
    the sequence (``reduce_output``), then the encoder's layers."""

    def __init__(self, enc: Any, vocab_size: int | None) -> None:
        """``vocab_size`` None: the input is a series of numbers, one channel (Ludwig's
        timeseries, which does not embed)."""
        from raylight.models.ecd import ACTIVATIONS

        super().__init__()
        self.embed = None if vocab_size is None else nn.Embedding(vocab_size, enc.embedding_size, padding_idx=0)
        channels = 1 if vocab_size is None else enc.embedding_size
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, layer.num_filters or enc.num_filters, layer.filter_size or enc.filter_size,
                      padding="same", bias=enc.use_bias)
            for layer in enc.conv_layers
        )
        self.activation = ACTIVATIONS[enc.activation]()
        self.dropout = nn.Dropout(enc.dropout) if enc.dropout > 0 else nn.Identity()
        self.pool = None if enc.pool_size is None else (
            nn.MaxPool1d(enc.pool_size, ceil_mode=True) if enc.pool_function == "max" else nn.AvgPool1d(enc.pool_size, ceil_mode=True)
        )
        self.reduce = enc.reduce_output
        self.fc = FCStack(enc, sum(layer.num_filters or enc.num_filters for layer in enc.conv_layers))
        self.width = self.fc.width

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embed(ids)).transpose(1, 2) if self.embed is not None else ids[:, None, :].float()  # (rows, channels, steps)
        parts = []
        for conv in self.convs:
            h = self.dropout(self.activation(conv(x)))
            parts.append(self.pool(h) if self.pool is not None else h)
        h = torch.cat(parts, dim=1)
        reduced = h.sum(2) if self.reduce == "sum" else h.mean(2) if self.reduce == "mean" else h.amax(2)
        return self.fc(reduced)

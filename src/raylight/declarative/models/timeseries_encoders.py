"""Ludwig's forecasting encoders for a timeseries input, from scratch: N-BEATS (``nbeats``)
and PatchTST (``patchtst``); their settings are ``features/timeseries.py``'s. Each takes
the rows' series, ``(rows, steps)``, and gives ``(rows, output_size)``, its width in
``width``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class NBeatsBlock(nn.Module):
    """Fully connected layers, then a backcast (the series' width) and a forecast head;
    the last block has no backcast head (no block reads its residual: under DDP a head
    that gets no gradient is an error)."""

    def __init__(self, steps: int, forecast: int, enc: Any, *, last: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = steps
        for _ in range(enc.num_layers):
            layers += [nn.Linear(width, enc.layer_size), nn.ReLU()]
            if enc.dropout > 0:
                layers.append(nn.Dropout(enc.dropout))
            width = enc.layer_size
        self.fc = nn.Sequential(*layers)
        self.backcast = None if last else nn.Linear(width, steps)
        self.forecast = nn.Linear(width, forecast)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return (torch.zeros_like(x) if self.backcast is None else self.backcast(h)), self.forecast(h)


class NBeats(nn.Module):
    """N-BEATS' doubly residual stacking: each block reads what the blocks before it left
    unexplained (the series minus their backcasts) and adds its forecast to theirs; the
    sum of the forecasts through a linear layer is the encoding (Ludwig's, but for the
    last block's backcast head, which Ludwig builds and never uses)."""

    def __init__(self, enc: Any, steps: int) -> None:
        super().__init__()
        self.size = enc.output_size
        # the stacks' blocks in order (a stack is its blocks: nothing of its own)
        count = enc.num_stacks * enc.num_blocks
        self.blocks = nn.ModuleList(NBeatsBlock(steps, enc.output_size, enc, last=i == count - 1) for i in range(count))
        self.out = nn.Linear(enc.output_size, enc.output_size)
        self.width = enc.output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x.float()
        forecast = residual.new_zeros(x.shape[0], self.size)
        for block in self.blocks:
            backcast, part = block(residual)
            residual = residual - backcast
            forecast = forecast + part
        return self.out(forecast)


class PatchTST(nn.Module):
    """PatchTST over one channel: patches projected, learned positions added, pre-norm
    transformer blocks, a layer norm, the patches reduced, a linear layer (Ludwig's)."""

    def __init__(self, enc: Any, steps: int) -> None:
        super().__init__()
        self.patch, self.stride, self.reduce = enc.patch_size, enc.patch_stride, enc.reduce_output
        self.project = nn.Linear(enc.patch_size, enc.d_model)
        self.positions = nn.Parameter(torch.zeros(1, patches(max(steps, enc.patch_size), self.patch, self.stride), enc.d_model))
        nn.init.trunc_normal_(self.positions, std=0.02)
        block = nn.TransformerEncoderLayer(
            enc.d_model, enc.num_heads, dim_feedforward=enc.ffn_dim, dropout=enc.dropout, batch_first=True, norm_first=True,
        )
        # no nested-tensor fast path: it applies to post-norm blocks only, and warns otherwise
        self.blocks = nn.TransformerEncoder(block, enc.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(enc.d_model)
        self.out = nn.Linear(enc.d_model, enc.output_size)
        self.width = enc.output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        if x.shape[1] < self.patch:  # one patch at least: the series padded with its last value
            x = torch.cat([x, x[:, -1:].expand(-1, self.patch - x.shape[1])], dim=1)
        h = self.project(x.unfold(1, self.patch, self.stride))  # (rows, patches, d_model)
        h = self.norm(self.blocks(h + self.positions[:, : h.shape[1]]))
        reduced = {"mean": lambda: h.mean(1), "last": lambda: h[:, -1], "first": lambda: h[:, 0]}[self.reduce]()
        return self.out(reduced)


def patches(steps: int, size: int, stride: int) -> int:
    """The patches of a series of ``steps`` (at least ``size``): unfold's count."""
    return (steps - size) // stride + 1


def series_encoder(enc: Any, steps: int) -> NBeats | PatchTST:
    """The module of a timeseries input's ``nbeats`` or ``patchtst`` encoder, over series of ``steps``."""
    return NBeats(enc, steps) if enc.type == "nbeats" else PatchTST(enc, steps)

"""Ludwig's TabNet combiner's torch modules (``combiners/tabnet.py`` has its settings):
the feature transformer of GLU blocks with ghost batch norm, the attentive transformer
with sparsemax or entmax, the decision steps. Sparsemax and entmax are written here
(Martins and Astudillo 2016; Peters et al. 2019)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from raylight.declarative.models.ecd import _BatchNorm


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of each row of ``z`` onto the simplex: sorted
    descending, the support is the k with 1 + k z_(k) > the sum of the first k, and
    tau = (that sum - 1) / k; the output is max(z - tau, 0)."""
    z = z - z.amax(-1, keepdim=True)  # the same projection, steadier
    ordered, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cumulative = ordered.cumsum(-1)
    support = (1 + k * ordered > cumulative).sum(-1, keepdim=True)
    tau = (cumulative.gather(-1, support - 1) - 1) / support.to(z.dtype)
    return (z - tau).clamp(min=0)


def entmax(z: torch.Tensor, alpha: torch.Tensor | float, iterations: int = 50) -> torch.Tensor:
    """alpha-entmax of each row by bisection on tau: p = [(alpha - 1) z - tau]_+ ^ (1 /
    (alpha - 1)), tau chosen so p sums to 1 (alpha 1 is softmax, 2 sparsemax). The
    gradient flows through the iterations."""
    alpha = torch.as_tensor(alpha, dtype=z.dtype, device=z.device).clamp(1 + 1e-3, 2)
    x = (alpha - 1) * (z - z.amax(-1, keepdim=True))
    exponent = 1 / (alpha - 1)
    low = torch.full_like(x[..., :1], -1.0)  # p sums to >= 1: the largest entry alone gives 1 at tau = -1
    high = torch.zeros_like(low)  # ... and to <= 1 at tau = 0 (the largest entry gives 0)
    for _ in range(iterations):
        mid = (low + high) / 2
        total = (x - mid).clamp(min=0).pow(exponent).sum(-1, keepdim=True)
        low = torch.where(total >= 1, mid, low)
        high = torch.where(total >= 1, high, mid)
    p = (x - (low + high) / 2).clamp(min=0).pow(exponent)
    return p / p.sum(-1, keepdim=True)


class GhostBatchNorm(nn.Module):
    """Batch norm over virtual batches of about ``virtual`` rows (as even as they split) in training (Hoffer et al.;
    Ludwig's GhostBatchNormalization); over the whole batch where ``virtual`` is None."""

    def __init__(self, width: int, virtual: int | None, momentum: float, eps: float) -> None:
        super().__init__()
        self.virtual = virtual
        self.bn = _BatchNorm(width, momentum=momentum, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.virtual is None or x.shape[0] <= self.virtual:
            return self.bn(x)
        return torch.cat([self.bn(chunk) for chunk in torch.chunk(x, math.ceil(x.shape[0] / self.virtual))], dim=0)


class FeatureBlock(nn.Module):
    """A linear layer without bias (``shared``: one of the steps' shared ones), ghost
    batch norm, then GLU (halving the width) unless ``glu`` is false."""

    def __init__(self, c: Any, width: int, size: int, glu: bool = True, shared: nn.Linear | None = None) -> None:
        super().__init__()
        units = size * 2 if glu else size
        self.fc = shared if shared is not None else nn.Linear(width, units, bias=False)
        self.bn = GhostBatchNorm(units, c.bn_virtual_bs, c.bn_momentum, c.bn_epsilon)
        self.glu = glu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.fc(x))
        return nn.functional.glu(h, dim=-1) if self.glu else h


class FeatureTransformer(nn.Module):
    """``num_total_blocks`` blocks, the first ``num_shared_blocks`` of them shared, each
    after the first added to its input and scaled by sqrt(1/2)."""

    def __init__(self, c: Any, width: int, size: int, shared: list[nn.Linear]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            FeatureBlock(c, width if n == 0 else size, size, shared=shared[n] if n < len(shared) else None)
            for n in range(c.num_total_blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x)
        for block in list(self.blocks)[1:]:
            h = (block(h) + h) * (0.5**0.5)
        return h


class AttentiveTransformer(nn.Module):
    """A feature block (no GLU) to the inputs' width, times the prior scales, mapped to a
    sparse mask by sparsemax or entmax."""

    def __init__(self, c: Any, width: int) -> None:
        super().__init__()
        self.block = FeatureBlock(c, c.size, width, glu=False)
        self.mode = c.entmax_mode
        # adaptive: alpha is learned (Ludwig's intent; its buffer is not trained)
        self.alpha = nn.Parameter(torch.tensor(float(c.entmax_alpha))) if self.mode == "adaptive" else float(c.entmax_alpha)

    def forward(self, x: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        h = self.block(x) * prior
        if self.mode == "sparsemax":
            return sparsemax(h)
        return entmax(h, 1.5 if self.mode == "entmax15" else self.alpha)


class TabNetModule(nn.Module):
    """TabNet over the concatenated inputs (``width`` of them); its output is
    ``output_size`` wide, and ``loss`` after each forward is the sparsity loss."""

    def __init__(self, c: Any, width: int) -> None:
        super().__init__()
        self.out, self.steps, self.relaxation, self.sparsity = c.output_size, c.num_steps, c.relaxation_factor, c.sparsity
        self.bn = _BatchNorm(width, momentum=c.bn_momentum, eps=c.bn_epsilon)
        size = c.size + c.output_size
        first = FeatureTransformer(c, width, size, [])
        shared: list[nn.Linear] = [first.blocks[n].fc for n in range(c.num_shared_blocks)]  # type: ignore[misc]
        self.features = nn.ModuleList([first, *(FeatureTransformer(c, width, size, shared) for _ in range(c.num_steps))])
        self.attention = nn.ModuleList(AttentiveTransformer(c, width) for _ in range(c.num_steps))
        self.projection = nn.Linear(c.output_size, c.output_size)
        self.dropout: nn.Module = nn.Dropout(c.dropout) if c.dropout > 0 else nn.Identity()
        self.width = c.output_size
        self.loss: torch.Tensor | None = None

    def forward(self, parts: list[torch.Tensor]) -> torch.Tensor:
        x = self.bn(torch.cat([p.reshape(p.shape[0], -1) for p in parts], dim=1))
        prior = torch.ones_like(x)
        total = x.new_zeros((x.shape[0], self.out))
        entropy = x.new_zeros(())
        h = self.features[0](x)
        for step in range(self.steps):
            mask = self.attention[step](h[:, self.out :], prior)
            prior = prior * (self.relaxation - mask)
            entropy = entropy + (-mask * torch.log(mask + 1e-5)).sum(1).mean() / self.steps
            h = self.features[step + 1](mask * x)
            total = total + torch.relu(h[:, : self.out])
        self.loss = self.sparsity * entropy if self.sparsity else None
        return self.dropout(self.projection(total))

"""The anomaly output's torch parts (``outputs/anomaly.py`` says what they mean): the
center-distance decoder and the Deep SVDD and Deep SAD losses, as Ludwig 0.17's."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class CenterDistance(nn.Module):
    """The squared distance of each row from ``center`` (a buffer, zeros until ``start``)."""

    center: torch.Tensor

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("center", torch.zeros(width))

    def start(self, hidden_mean: torch.Tensor) -> None:
        """Deep SVDD's center: the mean of the combiner's outputs before training."""
        with torch.no_grad():
            self.center.copy_(hidden_mean)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.center) ** 2).sum(dim=1, keepdim=True)


class DeepSVDD(nn.Module):
    """Soft boundary (``nu`` > 0): R + mean(max(0, score - R)) / nu, R the scores' (1 - nu)
    quantile without gradient; hard (``nu`` 0): the mean score. Labels unused."""

    def __init__(self, nu: float) -> None:
        super().__init__()
        self.nu = nu

    def forward(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.nu <= 0:
            return scores.mean()
        radius = torch.quantile(scores.detach().float(), 1.0 - self.nu).clamp(min=0.0)
        return radius + torch.clamp(scores - radius, min=0.0).mean() / self.nu


class DeepSAD(nn.Module):
    """Normal and unlabelled rows: their score; labelled anomalies (1): eta / (score + eps)."""

    EPSILON = 1e-6

    def __init__(self, eta: float) -> None:
        super().__init__()
        self.eta = eta

    def forward(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        anomaly = (target == 1).to(scores.dtype)
        return (scores * (1 - anomaly) + self.eta / (scores + self.EPSILON) * anomaly).mean()


def start_centers(model: nn.Module, chunks: Iterable[dict[str, torch.Tensor]]) -> bool:
    """Set each decoder that has a ``start`` to the mean of the combiner's outputs over
    ``chunks`` (the training split's inputs); whether there was one."""
    starting = [m for m in model.decoders.values() if hasattr(m, "start")]  # type: ignore[operator]
    if not starting:
        return False
    was = model.training
    model.eval()
    total, rows = None, 0
    with torch.no_grad():
        for batch in chunks:
            hidden = model.combined(batch)  # type: ignore[operator]
            total = hidden.sum(0) if total is None else total + hidden.sum(0)
            rows += hidden.shape[0]
    model.train(was)
    if total is not None and rows:
        for m in starting:
            m.start(total / rows)
    return True

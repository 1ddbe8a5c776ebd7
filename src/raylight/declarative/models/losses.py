"""Ludwig's losses that are more than a torch loss: a category output's ``objectosphere``
(Dhamija et al., NeurIPS 2018), as Ludwig 0.17's ObjectosphereLoss. The output types
(``raylight.declarative.outputs``) import this module when they make their loss."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

EPSILON = 1e-9  # inside the log of a probability (Ludwig's EPSILON)


class ObjectosphereLoss(nn.Module):
    """Known classes' rows: cross-entropy + max(0, xi - ||logits||)^2 (their logits pushed
    to a norm of at least ``xi``); the background class's rows: the negative entropy of
    their softmax + ``zeta`` x ||logits||^2 (near-uniform, small logits: an unknown input
    is told by its norm). Each part a mean over its rows, the two added (Ludwig's). With
    no ``background`` every row is known."""

    def __init__(self, background: int | None, xi: float, zeta: float) -> None:
        super().__init__()
        self.background, self.xi, self.zeta = background, xi, zeta

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.long()
        known = target != self.background if self.background is not None else torch.ones_like(target, dtype=torch.bool)
        loss = logits.new_zeros(())
        if known.any():
            mine = logits[known]
            hinge = torch.clamp(self.xi - mine.norm(dim=-1), min=0.0).pow(2).mean()
            loss = loss + F.cross_entropy(mine, target[known]) + hinge
        if (~known).any():
            unknown = logits[~known]
            probs = torch.softmax(unknown, dim=-1)
            negative_entropy = (probs * torch.log(probs + EPSILON)).sum(dim=-1).mean()
            loss = loss + negative_entropy + self.zeta * unknown.norm(dim=-1).pow(2).mean()
        return loss

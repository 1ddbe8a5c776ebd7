"""Gradient noise scale from data parallelism, at no extra cost (McCandlish et al. 2018).

Each replica's local gradient estimates the true gradient G at the small batch
``B_small`` (the atomic batch); the all-reduced gradient estimates it at ``B_big``
(all replicas and accumulation steps together). From the squared norms of the two::

    |G|^2     ~ (B_big * |g_big|^2 - B_small * |g_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

Both are unbiased but noisy, so numerator quantities are smoothed separately with a
bias-corrected exponential moving average and only then divided:
``noise_scale = tr(Sigma) / |G|^2`` (B_simple, in samples). Pure Python, no torch.
"""

from __future__ import annotations

import math
from typing import Any

from raylight.adaptive.goodput import GradParams


class NoiseScaleEstimator:
    def __init__(self, smoothing: float = 0.95) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # sum of EMA weights, for bias correction
        self.num_updates = 0
        self.num_skipped = 0

    def update(self, *, small_sqr: float, small_batch: float, big_sqr: float, big_batch: float) -> bool:
        """Add one step's norms. Returns False (and skips) for unusable input:
        non-finite norms (e.g. an fp16 overflow) or no second batch size."""
        values = (small_sqr, small_batch, big_sqr, big_batch)
        if not all(math.isfinite(v) for v in values) or big_batch <= small_batch or small_batch <= 0:
            self.num_skipped += 1
            return False
        grad_sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
        grad_var = (small_sqr - big_sqr) / (1.0 / small_batch - 1.0 / big_batch)
        beta = self.smoothing
        self._sqr = beta * self._sqr + (1 - beta) * grad_sqr
        self._var = beta * self._var + (1 - beta) * grad_var
        self._weight = beta * self._weight + (1 - beta)
        self.num_updates += 1
        return True

    @property
    def ready(self) -> bool:
        return self.num_updates > 0

    @property
    def sqr(self) -> float:
        """Smoothed |G|^2 (bias-corrected)."""
        return self._sqr / self._weight if self._weight else 0.0

    @property
    def var(self) -> float:
        """Smoothed tr(Sigma), the per-sample gradient variance (bias-corrected)."""
        return self._var / self._weight if self._weight else 0.0

    @property
    def noise_scale(self) -> float:
        """B_simple = tr(Sigma) / |G|^2, in samples; inf while |G|^2 is not positive."""
        sqr, var = self.sqr, max(self.var, 0.0)
        return var / sqr if sqr > 0 else math.inf

    def grad_params(self, init_batch_size: int) -> GradParams:
        """GradParams for GoodputFunction: variance of a gradient at batch M0."""
        return GradParams(sqr=max(self.sqr, 0.0), var=max(self.var, 0.0) / init_batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sqr": self._sqr,
            "var": self._var,
            "weight": self._weight,
            "num_updates": self.num_updates,
            "num_skipped": self.num_skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sqr = float(state["sqr"])
        self._var = float(state["var"])
        self._weight = float(state["weight"])
        self.num_updates = int(state["num_updates"])
        self.num_skipped = int(state["num_skipped"])

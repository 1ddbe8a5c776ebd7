"""Learning-rate rules for a batch size scaled by S = M / M0, pure and vectorised.

    adascale  lr = r * lr0, and training progress advances by r per step (Johnson et al.
              2020): r = (var + sqr) / (var / S + sqr) is the gain of one step at batch M
              in steps at M0, so schedules keyed on progress keep their meaning
    sqrt      lr = sqrt(S) * lr0 (Adam family)
    linear    lr = S * lr0 (Goyal et al. 2017)
    legw      linear, warmed up over warmup_steps * S steps of progress (LEGW: the
              warm-up grows with the batch)
    none      lr = lr0
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from raylight.config.schema import LR_RULES, LRRule  # the names' one home: the setting

__all__ = ["LR_RULES", "LRRule", "lr_factor", "progress_increment"]


def lr_factor(
    rule: LRRule,
    scale: ArrayLike,
    gain: ArrayLike,
    *,
    progress: ArrayLike = 0.0,
    warmup_steps: float = 0.0,
) -> np.ndarray:
    """Multiplier of the base learning rate for batch scale S and AdaScale gain r."""
    s = np.asarray(scale, dtype=float)
    if rule == "adascale":
        return np.asarray(gain, dtype=float) * np.ones_like(s)
    if rule == "sqrt":
        return np.sqrt(s)
    if rule == "linear":
        return s
    if rule == "legw":
        if warmup_steps <= 0:
            return s
        warm = np.minimum(1.0, (np.asarray(progress, dtype=float) + 1.0) / (warmup_steps * s))
        return s * warm
    if rule == "none":
        return np.ones_like(s)
    raise ValueError(f"unknown lr_rule {rule!r}; choose one of {', '.join(LR_RULES)}")


def progress_increment(rule: LRRule, scale: float, gain: float) -> float:
    """How much scale-invariant progress (in steps at M0) one step makes.

    AdaScale counts the gain r; the other rules count S, the samples seen in units of M0.
    """
    return float(gain) if rule == "adascale" else float(scale)

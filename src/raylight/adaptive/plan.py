"""What the driver's adaptive engine and the workers' step sync exchange: the batch plan
to follow, the settings a worker's context needs, and what rank 0 measured. Plain data,
no torch, no Ray; the adaptive package's own vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchPlan:
    """How each optimizer step is made: ``atomic_bsz`` samples per worker per micro-step,
    ``accum_steps`` extra micro-steps; ``version`` orders plans (the newest wins)."""

    atomic_bsz: int
    accum_steps: int = 0
    version: int = 0

    def global_batch(self, num_replicas: int) -> int:
        return num_replicas * self.atomic_bsz * (self.accum_steps + 1)


@dataclass(frozen=True)
class AdaptiveSpec:
    """Adaptive and elastic settings a worker's context needs (from the driver)."""

    adaptive: bool  # batch size and LR follow the plan and the LR rule
    lr_rule: str
    lr_warmup_steps: float
    noise_smoothing: float
    control_interval_steps: int  # AdaptiveConfig holds the defaults
    plan: BatchPlan | None = None  # None: derive from the loader's batch_size
    num_nodes: int = 1


@dataclass(frozen=True)
class AdaptiveStats:
    """What rank 0 tells the driver about adaptive training since the last poll."""

    profile: list[list[Any]]  # StepProfile increments, as StepProfile.to_json()
    plan: BatchPlan
    init_batch_size: int
    grad_sqr: float
    grad_var: float
    lr_factor: float
    progress: float
    threads: int
    dataset_size: int | None = None  # samples per epoch of the training loader

"""RayShardedStrategy: ray_lightning's name for sharded training, run as RayFSDPStrategy.

ray_lightning's ``RayShardedStrategy`` was DDP with fairscale's sharded optimizer state
and gradients (ZeRO-2). Lightning 2 dropped fairscale; raylight's sharded strategy is
FSDP2, which shards the parameters too (ZeRO-3): the same memory saving and more, the same
results as DDP up to float rounding. A script that names ``RayShardedStrategy`` runs
unchanged and is told once, at construction, that FSDP runs it.
"""

from __future__ import annotations

import warnings
from typing import Any

from raylight.lightning.fsdp import RayFSDPStrategy

NOTE = (
    "RayShardedStrategy runs as RayFSDPStrategy (PyTorch FSDP2: parameters, gradients and "
    "optimizer state sharded), as Lightning 2 dropped fairscale's sharding; see docs/lightning.md"
)


class RayShardedStrategy(RayFSDPStrategy):
    """ray_lightning's ``RayShardedStrategy``, as ``RayFSDPStrategy``: takes the same
    arguments (ray_lightning's ``num_workers``, ``num_cpus_per_worker``, ``use_gpu``,
    ``init_hook``, ``resources_per_worker`` among them) and warns once that FSDP runs it."""

    strategy_name = "raylight_sharded"

    def __init__(self, num_workers: int = 1, **kwargs: Any) -> None:
        warnings.warn(NOTE, UserWarning, stacklevel=2)
        super().__init__(num_workers, **kwargs)

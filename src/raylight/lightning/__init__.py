"""PyTorch Lightning on raylight: ``RayStrategy`` (DDP), ``RayFSDPStrategy`` (FSDP2),
``RayDeepSpeedStrategy`` (ZeRO; needs the ``deepspeed`` extra), ``HorovodRayStrategy``
(DDP with ``raylight.horovod`` ready on every worker) and ``RayShardedStrategy``
(ray_lightning's name, run as ``RayFSDPStrategy``).

The ``pl.Trainer`` stays on the driver; the strategy runs fit, validate, test and
predict on raylight workers (Ray actors) and brings rank 0's results back. Needs the
``lightning`` extra: ``pip install 'raylight[lightning]'``.
"""

try:
    import lightning.pytorch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "raylight.lightning needs PyTorch Lightning: pip install 'raylight[lightning]' "
        f"(lightning>=2.4,<2.7); importing it failed with: {exc}"
    ) from exc

from raylight.lightning.checkpoint_io import AtomicCheckpointIO
from raylight.lightning.deepspeed import RayDeepSpeedStrategy
from raylight.lightning.environment import RaylightEnvironment
from raylight.lightning.fsdp import RayFSDPStrategy
from raylight.lightning.horovod import HorovodRayStrategy
from raylight.lightning.sharded import RayShardedStrategy
from raylight.lightning.strategies import RayStrategy

__all__ = [
    "AtomicCheckpointIO", "HorovodRayStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy", "RayShardedStrategy", "RayStrategy",
    "RaylightEnvironment",
]

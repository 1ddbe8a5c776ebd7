"""HorovodRayStrategy: ray_lightning's Horovod strategy, on raylight's DDP workers.

The constructor is ray_lightning's (``num_workers``, or ``num_hosts`` x ``num_slots``;
``use_gpu``) plus ``implementation``. Training runs as ``RayStrategy`` runs it (DDP on
raylight workers, the Trainer on the driver, notebook-safe, ``fit`` as often as wanted,
``callback_metrics`` back); on each worker Horovod is initialised before the Trainer starts
and shut down at teardown: real ``horovod.torch`` where it is installed
(``raylight.worker.hvd.real``: a rendezvous server on rank 0, Horovod's gloo controller), else
``raylight.horovod`` on the worker's process group. So a LightningModule's ``hvd.rank()``,
``hvd.size()``, ``hvd.allreduce(...)`` work unchanged. Gradients are reduced by DDP, not by
Horovod's ``DistributedOptimizer`` (the result is the same average); see docs/horovod.md
for how this differs from ray_lightning's.
"""

from __future__ import annotations

from typing import Any

from raylight.base.exceptions import ConfigError
from raylight.config.schema import HOROVOD_IMPLEMENTATIONS
from raylight.lightning.strategies import RayStrategy
from raylight.worker.hvd import basics as hvd


def _num_workers(num_workers: Any, num_hosts: Any, num_slots: Any) -> Any:
    if num_workers is not None:
        if num_hosts is not None or num_slots is not None:
            raise ConfigError(
                "HorovodRayStrategy: give num_workers, or num_hosts and num_slots, not both"
            )
        return num_workers
    if num_hosts is None and num_slots is None:
        return 1
    for name, value in (("num_hosts", num_hosts), ("num_slots", num_slots)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"HorovodRayStrategy({name}={value!r}): needs an int >= 1 (workers = num_hosts x num_slots)"
            )
    return num_hosts * num_slots


class HorovodRayStrategy(RayStrategy):
    """Horovod-style Lightning training on raylight workers; ``raylight.horovod`` is
    ready on every worker.

    Args:
        num_workers: number of worker processes (Ray actors), one rank each.
        num_hosts, num_slots: ray_lightning's alternative: ``num_hosts * num_slots``
            workers. raylight places them as ``placement`` says (PACK by default); it does
            not pin ``num_slots`` to each host.
        use_gpu: give each worker a GPU.
        implementation: which Horovod the workers initialise: ``"horovod"`` (real
            ``horovod.torch``, which must be installed), ``"raylight"``
            (``raylight.horovod``), ``"auto"`` (real Horovod where installed).
        **kwargs: as ``RayStrategy`` (``resources_per_worker``, ``placement``,
            ``failure``, ``address``, ...).
    """

    strategy_name = "raylight_horovod"

    def __init__(
        self,
        num_workers: int | None = None,
        num_hosts: int | None = None,
        num_slots: int | None = None,
        use_gpu: bool = False,
        implementation: str = "auto",
        **kwargs: Any,
    ) -> None:
        from raylight.worker.strategies.horovod import resolve_implementation

        if implementation not in HOROVOD_IMPLEMENTATIONS:
            raise ConfigError(
                f"HorovodRayStrategy(implementation={implementation!r}): choose one of {list(HOROVOD_IMPLEMENTATIONS)}"
            )
        super().__init__(_num_workers(num_workers, num_hosts, num_slots), use_gpu=use_gpu, **kwargs)
        self.implementation = resolve_implementation(implementation, setting="HorovodRayStrategy(implementation=...)")
        self._real: Any = None  # raylight.worker.hvd.real.RealHorovod, on a worker

    def attach_worker(self, ctx: Any, trainer: Any) -> None:
        super().attach_worker(ctx, trainer)
        if self.implementation == "horovod":
            from raylight.worker.hvd.real import init_horovod

            self._real = init_horovod(
                timeout_s=self.settings.failure.collective_timeout_s,
                setting="HorovodRayStrategy(failure=FailureConfig(collective_timeout_s=...))",
            )
        else:
            hvd.init()  # adopts the group raylight formed for this worker

    def teardown(self) -> None:
        super().teardown()
        if self._real is not None:
            real, self._real = self._real, None
            real.shutdown()  # hvd.shutdown(); rank 0 stops its rendezvous server
        else:
            hvd.shutdown()  # forgets the group (raylight's, left formed); a reused process starts clean

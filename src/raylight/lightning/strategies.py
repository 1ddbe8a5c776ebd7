"""RayStrategy (DDP), and what every raylight Lightning strategy shares: its processes
are raylight workers on Ray.

Each strategy is a Lightning strategy (``RayStrategy``: public ``DDPStrategy``;
``RayFSDPStrategy``: ``ParallelStrategy``, fsdp.py; ``RayDeepSpeedStrategy``:
``DeepSpeedStrategy``, deepspeed.py) with four changes, the same for all and written
once here (``_RayWorkers``): the launcher is
``RayLauncher``; the cluster environment is ``RaylightEnvironment``, filled in on the
worker from raylight's TrainContext; the root device is the worker's; and the sampler
shards over raylight's world size (not Lightning's device count). The process group is
formed by raylight before Lightning starts, and Lightning reuses it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from raylight.base.exceptions import ConfigError
from raylight.config import (
    DDP,
    AdaptiveConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
    validate,
)
from raylight.lightning._launcher import RayLauncher
from raylight.lightning._quiet import quiet_lightning
from raylight.lightning.adaptive import AdaptiveSteps, adapt_train_loader, lightning_adaptive
from raylight.lightning.checkpoint_io import AtomicCheckpointIO
from raylight.lightning.environment import RaylightEnvironment

# Lightning arguments raylight sets itself, with the values Lightning's own defaults give
# them: LightningCLI passes every argument of DDPStrategy, these included, at its default;
# a default is dropped, any other value refused.
_RESERVED: dict[str, Any] = {
    "cluster_environment": None, "parallel_devices": None, "start_method": "popen", "accelerator": None,
}

# The arguments every raylight Lightning strategy takes (``RayFSDPStrategy`` and
# ``RayDeepSpeedStrategy`` all but ``adaptive``), with their defaults: each strategy's
# signature lists them, as users pass them by name, with these defaults (a unit test holds
# the signatures to this table), and hands them over in one call, ``make_settings(owner,
# locals(), ...)``; ``RaySettings`` documents them.
WORKER_ARGUMENTS: dict[str, Any] = {
    "num_workers": 1,
    "use_gpu": False,
    "resources_per_worker": None,
    "placement": "PACK",
    "threads_per_worker": None,
    "failure": None,
    "adaptive": None,
    "address": None,
    "num_cpus_per_worker": None,
    "init_hook": None,
}


@dataclass(frozen=True)
class RaySettings:
    """Where and how a strategy's workers run: the arguments every raylight Lightning
    strategy takes (``WORKER_ARGUMENTS``), validated into raylight's configs by
    ``make_settings``.

    Args:
        num_workers: number of worker processes (Ray actors), one rank each.
        use_gpu: give each worker a GPU (NCCL); else CPU with gloo.
        resources_per_worker: Ray resources per worker, e.g. ``{"CPU": 2}``.
        placement: placement-group strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD.
        threads_per_worker: torch threads per worker (default: its CPUs).
        failure: raylight ``FailureConfig`` (timeouts, ``max_failures``).
        adaptive: raylight ``AdaptiveConfig`` (``RayStrategy`` only): adapt batch size and
            LR online (see docs/lightning.md for what is adapted).
        address: Ray cluster address; default: the running or an embedded local Ray.
        num_cpus_per_worker: ray_lightning's name for ``resources_per_worker={"CPU": n}``.
        init_hook: a function of no arguments run in each worker before the Trainer's
            entry point (ray_lightning's ``init_hook``); it travels pickled.
    """

    scaling: ScalingConfig
    failure: FailureConfig = field(default_factory=FailureConfig)
    adaptive: AdaptiveConfig | None = None
    address: str | None = None
    init_hook: Callable[[], Any] | None = None

    def trainer_config(self, *, storage_path: str) -> TrainerConfig:
        return TrainerConfig(
            scaling=self.scaling,
            failure=self.failure,
            adaptive=self.adaptive,
            address=self.address,
            run=RunConfig(storage_path=storage_path, name="lightning", progress=False, checkpoints_to_keep=1),
        )


def make_settings(
    owner: str, arguments: Mapping[str, Any], *, strategy: DDP | None = None, kwargs: dict[str, Any]
) -> RaySettings:
    """Validate a strategy's ``WORKER_ARGUMENTS`` (read from ``arguments``, its
    constructor's ``locals()``; one it does not take has its default) and the ``kwargs``
    it passes on to Lightning; errors name ``owner(argument=...)``. Called as the strategy
    is made, before the Trainer that gets it: Lightning's INFO lines and tips are turned off
    from here unless verbose (``_quiet``)."""
    quiet_lightning()
    _known_to_the_old_package()
    given = {name: arguments.get(name, default) for name, default in WORKER_ARGUMENTS.items()}
    num_workers, failure, adaptive = given["num_workers"], given["failure"], given["adaptive"]
    for key, default in _RESERVED.items():
        if key in kwargs and kwargs[key] == default:
            del kwargs[key]  # Lightning's default, as LightningCLI passes it: raylight's own instead
        elif key in kwargs:
            raise ConfigError(
                f"{owner}({key}=...) is not accepted: raylight chooses the {key} of its "
                "workers; remove the argument"
            )
    init_hook = given["init_hook"]
    if init_hook is not None and not callable(init_hook):
        raise ConfigError(
            f"{owner}(init_hook={init_hook!r}): needs a function of no arguments (run in each worker "
            "before training), or None"
        )
    resources = _resources(owner, given["resources_per_worker"], given["num_cpus_per_worker"])
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(
            f"{owner}(num_workers={num_workers!r}): needs an int >= 1 (the number of Ray "
            "worker processes); elastic (min, max) sizes are not supported with Lightning"
        )
    if failure is not None and not isinstance(failure, FailureConfig):
        raise ConfigError(f"{owner}(failure=...) must be a raylight.FailureConfig, got {type(failure).__name__}")
    if adaptive is not None and not isinstance(adaptive, AdaptiveConfig):
        raise ConfigError(f"{owner}(adaptive=...) must be a raylight.AdaptiveConfig, got {type(adaptive).__name__}")
    scaling = validate(
        ScalingConfig,
        {
            **{k: given[k] for k in ("num_workers", "use_gpu", "placement", "threads_per_worker")},
            "resources_per_worker": resources,
            **({"strategy": strategy} if strategy is not None else {}),
        },
        prefix=owner,
    )
    return RaySettings(
        scaling=scaling,
        failure=failure or FailureConfig(),
        adaptive=lightning_adaptive(adaptive),
        address=given["address"],
        init_hook=init_hook,
    )


def _resources(owner: str, resources: Any, num_cpus: Any) -> Any:
    """``resources_per_worker`` with ray_lightning's ``num_cpus_per_worker`` folded in as its
    ``CPU`` (the two must agree where both are given)."""
    if num_cpus is None:
        return resources
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int | float) or num_cpus <= 0:
        raise ConfigError(f"{owner}(num_cpus_per_worker={num_cpus!r}): needs a number > 0 (CPUs per worker), or None")
    if not isinstance(resources, dict | None):
        return resources  # the schema names the type
    given = dict(resources or {})
    if "CPU" in given and given["CPU"] != num_cpus:
        raise ConfigError(
            f"{owner}(num_cpus_per_worker={num_cpus!r}) and resources_per_worker={{'CPU': {given['CPU']!r}}} "
            "disagree: give the CPUs once"
        )
    return {**given, "CPU": num_cpus}


def _known_to_the_old_package() -> None:
    """Where the user imported ``pytorch_lightning`` (the old package name ray_lightning's
    scripts import), make its Trainer accept raylight's strategies for as long as it takes
    to refuse them in one line (``_refuse_the_old_package``): otherwise it says only that a
    strategy must be a ``pytorch_lightning.strategies.Strategy``. ``register`` is the public
    ABC API and changes nothing for the ``lightning.pytorch`` Trainer."""
    old = sys.modules.get("pytorch_lightning.strategies")
    if old is not None:
        old.Strategy.register(_RayWorkers)


def _refuse_the_old_package(strategy: Any) -> None:
    accelerator = strategy.accelerator
    if accelerator is not None and type(accelerator).__module__.split(".")[0] == "pytorch_lightning":
        raise ConfigError(
            f"{type(strategy).__name__} is built on lightning.pytorch, and this Trainer is a "
            "pytorch_lightning.Trainer (the old package name): import Trainer, LightningModule and "
            "callbacks from lightning.pytorch instead (`import lightning.pytorch as pl`, the same API)"
        )


def _environment(settings: RaySettings) -> RaylightEnvironment:
    return RaylightEnvironment(world_size=settings.scaling.min_workers)


def _attach(strategy: Any, ctx: Any, trainer: Any) -> None:
    """On a worker: take the rank and device raylight gave this process; with adaptive
    training, drive raylight's StepSync from Lightning's loop."""
    strategy.cluster_environment = RaylightEnvironment(
        world_size=ctx.world_size,
        global_rank=ctx.rank,
        local_rank=ctx.local_rank,
        node_rank=ctx.node_rank,
    )
    strategy._raylight_ctx = ctx
    if ctx.device.type == "cuda" and not isinstance(strategy.accelerator, CUDAAccelerator):
        # The driver may have no GPU (its Trainer chose the CPU); the worker has one.
        strategy.accelerator = CUDAAccelerator()
        plugin = strategy.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.device != "cuda":
            # its autocast was for the driver's CPU: on the GPU the step would run in fp32
            strategy.precision_plugin = MixedPrecision(plugin.precision, "cuda")  # type: ignore[arg-type]  # a MixedPrecision's own
    if _adaptive_sync(strategy) is not None:
        trainer.callbacks.append(AdaptiveSteps(ctx.sync, strategy))
    hook = strategy.settings.init_hook
    if hook is not None:
        hook()  # ray_lightning's init_hook: in each worker, before the entry point


def _take_clipping(trainer: Any) -> float | None:
    """Adaptive runs: ``Trainer(gradient_clip_val=...)`` as the prepared optimizer's
    ``max_grad_norm``, and Lightning's own clipping turned off on this worker's trainer.

    Lightning clips inside the optimizer's closure, before raylight's optimizer steps: on
    the steps that measure the gradient noise (DDP does not all-reduce them; the optimizer
    does, after the closure) it would clip each worker's own gradient, and the noise would
    be measured on clipped gradients. raylight clips the averaged gradient right before the
    step instead. A ``configure_gradient_clipping`` of the module's own is left to run as
    written; clipping by value is refused."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    clip = trainer.gradient_clip_val
    if not clip or is_overridden("configure_gradient_clipping", trainer.lightning_module):
        return None
    if trainer.gradient_clip_algorithm == "value":
        raise ConfigError(
            "Trainer(gradient_clip_algorithm='value') under RayStrategy(adaptive=...) would clip "
            "each worker's own gradient on the steps that measure the gradient noise; use "
            "gradient_clip_algorithm='norm' (raylight then clips the averaged gradient), or drop adaptive="
        )
    trainer.gradient_clip_val = None  # raylight clips instead (until the strategy's teardown)
    return float(clip)


def _adaptive_sync(strategy: Any) -> Any:
    ctx = strategy._raylight_ctx
    return ctx.sync if ctx is not None and ctx.sync is not None and ctx.sync.adaptive else None


def _root_device(strategy: Any) -> torch.device:
    ctx = strategy._raylight_ctx
    if ctx is not None:
        return ctx.device
    devices = strategy.parallel_devices
    return devices[0] if devices else torch.device("cpu")


def _sampler_kwargs(strategy: Any) -> dict[str, Any]:
    return {"num_replicas": strategy.world_size, "rank": strategy.global_rank}


class _RayWorkers:
    """What both strategies change in Lightning's: the launcher, the worker's rank and
    device, and the sampler's world. Listed first in their bases, so it takes precedence."""

    settings: RaySettings
    _launcher: Any  # Lightning's Strategy attribute, set by _configure_launcher

    def attach_worker(self, ctx: Any, trainer: Any) -> None:
        _attach(self, ctx, trainer)

    # ray_lightning's attributes (its Tune helpers and tests read them), from the settings
    @property
    def num_workers(self) -> int:
        return self.settings.scaling.min_workers

    @property
    def use_gpu(self) -> bool:
        return self.settings.scaling.use_gpu

    @property
    def num_cpus_per_worker(self) -> float:
        return self.settings.scaling.worker_resources().get("CPU", 0.0)

    def driver_weights(self) -> dict[str, Any]:
        """The trained weights the driver gets, whole (every rank calls it: gathering
        sharded parameters is a collective)."""
        return self.lightning_module_state_dict()  # type: ignore[attr-defined]  # Lightning's Strategy

    @property
    def root_device(self) -> torch.device:
        return _root_device(self)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return _sampler_kwargs(self)

    def _configure_launcher(self) -> None:
        _refuse_the_old_package(self)  # called by the Trainer's constructor
        self._launcher = RayLauncher(self.settings)


class RayStrategy(_RayWorkers, DDPStrategy):
    """DDP over ``num_workers`` raylight workers on Ray; the Trainer stays on the driver.

    Args:
        num_workers, use_gpu, resources_per_worker, placement, threads_per_worker,
        failure, adaptive, address, num_cpus_per_worker, init_hook: where and how the
            workers run (``RaySettings``; the last two are ray_lightning's names).
        checkpoint_io: default ``AtomicCheckpointIO`` (atomic writes, safe loads).
        shared_memory: CPU workers on one machine average the gradients through shared
            memory (``raylight.DDP(shared_memory=...)``, docs/strategies.md); False: gloo.
        **ddp_kwargs: passed to Lightning's ``DDPStrategy`` (e.g. ``find_unused_parameters``).
    """

    strategy_name = "raylight_ddp"

    def __init__(
        self,
        num_workers: int = 1,
        *,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        placement: str = "PACK",
        threads_per_worker: int | None = None,
        failure: FailureConfig | None = None,
        adaptive: AdaptiveConfig | None = None,
        address: str | None = None,
        num_cpus_per_worker: float | None = None,
        init_hook: Callable[[], Any] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        shared_memory: bool = True,
        **ddp_kwargs: Any,
    ) -> None:
        self.settings = make_settings("RayStrategy", locals(), strategy=DDP(shared_memory=shared_memory), kwargs=ddp_kwargs)
        self._raylight_ctx: Any = None  # the worker's TrainContext, set on the worker
        super().__init__(
            cluster_environment=_environment(self.settings),
            checkpoint_io=checkpoint_io or AtomicCheckpointIO(),
            **ddp_kwargs,
        )

    def _register_ddp_hooks(self) -> None:
        """Lightning registers a ``ddp_comm_hook`` on GPUs only; on CPU workers raylight's
        DDP averages the gradients through shared memory where it can, as in
        ``raylight.fit`` (``shared_memory=False``: through gloo). A ``ddp_comm_hook`` of
        the user's is left to Lightning."""
        super()._register_ddp_hooks()
        ctx = self._raylight_ctx
        share = getattr(ctx._strategy, "share_memory_for", None) if ctx is not None else None
        if share is not None and self._ddp_comm_hook is None and isinstance(self.model, DistributedDataParallel):
            share(self.model, self.root_device)
            ctx.use_strategy_reducer()


    def process_dataloader(self, dataloader: Any) -> Any:
        sync = _adaptive_sync(self)
        if sync is None or sync.ready or self.lightning_module is None:
            return dataloader
        if self.lightning_module.trainer.state.stage != RunningStage.TRAINING:
            return dataloader  # only the training loader follows the plan
        if not isinstance(dataloader, DataLoader):
            raise ConfigError(
                f"RayStrategy(adaptive=...) needs a torch DataLoader for training, got "
                f"{type(dataloader).__name__}; drop adaptive= or return a DataLoader"
            )
        return adapt_train_loader(dataloader, sync, self.world_size)

    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)
        if _adaptive_sync(self) is None:
            return
        if len(self.optimizers) != 1:
            raise ConfigError(
                f"RayStrategy(adaptive=...) adapts one optimizer; configure_optimizers returned "
                f"{len(self.optimizers)}. Drop adaptive= or use a single optimizer"
            )
        clip = _take_clipping(trainer)
        if clip is not None:  # given back at teardown: a launched rank's Trainer is the user's
            self._lightning_clip = (trainer, clip)
        self.optimizers = [self._raylight_ctx.prepare_optimizer(self.optimizers[0], max_grad_norm=clip)]

    def teardown(self) -> None:
        held = self.__dict__.pop("_lightning_clip", None)
        if held is not None:
            held[0].gradient_clip_val = held[1]
        super().teardown()

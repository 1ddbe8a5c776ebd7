"""RayFSDPStrategy: fully sharded data parallel (PyTorch FSDP2) for Lightning, on
raylight workers, on CPUs (gloo) and GPUs (NCCL).

Built on Lightning's public ``ParallelStrategy`` (as Lightning's own FSDP strategies
are), with raylight's FSDP2 application (``raylight.worker.strategies.fsdp``) doing the
sharding: the same block policy, options (``raylight.FSDP``) and full-state hooks as
``raylight.fit(strategy=FSDP(...))``, not a second sharding policy. Lightning's
``ModelParallelStrategy`` (FSDP2 too) was not used because it shards nothing itself:
it raises unless the LightningModule overrides ``configure_model`` and calls
``fully_shard`` there, so a drop-in strategy would have to replace its ``setup``
wholesale (with private Lightning helpers), and its own checkpoint loading bypasses
the ``CheckpointIO``. It is also marked experimental.

What runs where, on each worker:

- ``setup`` shards the LightningModule in place (``fully_shard`` per block, then the
  module itself as the root), for fit and for validate/test/predict, and wraps it in
  ``_Root``, a module whose forward calls the LightningModule: Lightning then routes
  ``training_step`` (and the other steps) through that forward, so the root's FSDP
  hooks (gather before, reshard and reduce-scatter after) run around every step even
  when a step calls submodules rather than ``self(x)``.
- Checkpoints are full state dicts: model and optimizer shards are gathered into plain
  CPU tensors on every rank (a collective) and rank 0 writes them through the
  ``CheckpointIO`` (``AtomicCheckpointIO`` by default). A checkpoint therefore loads
  anywhere: ``torch.load``, ``LightningModule.load_from_checkpoint``, ``RayStrategy``
  or this strategy at any world size. Loading before sharding is plain; a full
  optimizer state loaded after sharding is cut to each rank's shard by raylight's hook.
- ``lightning_module_state_dict`` gathers the same way, which is how the driver gets
  the trained weights (``_worker.collect``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.config import FailureConfig, validate
from raylight.config.schema import FSDP
from raylight.lightning._launcher import RayLauncher
from raylight.lightning.checkpoint_io import AtomicCheckpointIO
from raylight.lightning.strategies import (
    _environment,
    _RayWorkers,
    _refuse_the_old_package,
    make_settings,
)
from raylight.storage.checkpoint import to_cpu
from raylight.worker.strategies.fsdp import FSDPStrategy as _Sharding
from raylight.worker.strategies.fsdp import check_shardable, full_tensors

_OWNER = "RayFSDPStrategy"


class _Root(nn.Module):
    """The module Lightning calls for each step: its forward calls the (sharded)
    LightningModule, so FSDP's root hooks run around the step (Lightning's forward
    redirection replaces the LightningModule's forward with the step for that call)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def fsdp_options(
    *,
    blocks: tuple[str, ...] | list[str] | None,
    min_block_params: int,
    reshard_after_forward: bool,
    mixed_precision: str | None,
    cpu_offload: bool,
    use_gpu: bool,
) -> FSDP:
    """raylight's FSDP options, validated; errors name ``RayFSDPStrategy(argument=...)``."""
    if cpu_offload and not use_gpu:
        raise ConfigError(
            f"{_OWNER}(cpu_offload=True) needs use_gpu=True: with CPU workers the shards are in "
            "CPU memory already; drop cpu_offload"
        )
    return validate(
        FSDP,
        {
            "blocks": tuple(blocks) if isinstance(blocks, list) else blocks,
            "min_block_params": min_block_params,
            "reshard_after_forward": reshard_after_forward,
            "mixed_precision": mixed_precision,
            "cpu_offload": cpu_offload,
            "checkpoint": "full",  # Lightning's checkpoints go through the CheckpointIO
        },
        prefix=_OWNER,
    )


class RayFSDPStrategy(_RayWorkers, ParallelStrategy):
    """FSDP2 (``fully_shard``) over ``num_workers`` raylight workers, on CPUs or GPUs;
    the Trainer stays on the driver.

    Args:
        num_workers, use_gpu, resources_per_worker, placement, threads_per_worker,
        failure, address, num_cpus_per_worker, init_hook: where and how the workers run
            (``RaySettings``).
        checkpoint_io: as for ``RayStrategy``.
        blocks: class names of the submodules to shard one by one (e.g.
            ``("TransformerBlock",)``); default: every submodule holding at least
            ``min_block_params`` parameters not already in a smaller block. The
            LightningModule itself is always sharded last (the root).
        min_block_params: the default block policy's size threshold.
        reshard_after_forward: free a block's gathered parameters after its forward.
        mixed_precision: ``"bf16"`` or ``"fp16"``: gather parameters and reduce gradients
            in that dtype (the shards and the optimizer state stay fp32).
        cpu_offload: GPU workers: keep shards, gradients and optimizer state in CPU memory.

    These are ``raylight.FSDP``'s options; see docs/lightning.md for checkpoints.
    """

    strategy_name = "raylight_fsdp"

    def __init__(
        self,
        num_workers: int = 1,
        *,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        placement: str = "PACK",
        threads_per_worker: int | None = None,
        failure: FailureConfig | None = None,
        address: str | None = None,
        num_cpus_per_worker: float | None = None,
        init_hook: Callable[[], Any] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        blocks: tuple[str, ...] | list[str] | None = None,
        min_block_params: int = 100_000,
        reshard_after_forward: bool = True,
        mixed_precision: str | None = None,
        cpu_offload: bool = False,
        **kwargs: Any,
    ) -> None:
        settings = make_settings(_OWNER, locals(), kwargs=kwargs)
        # FSDP runs in the workers (raylight's, below): they start as FSDP workers do
        # (malloc's tunables on CPU), and the pool keeps them apart from DDP's, since
        # FSDP tunes their malloc for its buffers (strategies.base.keep_heap_small).
        self.settings = replace(settings, scaling=settings.scaling.for_processes_of("fsdp"))
        if kwargs:
            key = next(iter(kwargs))
            raise ConfigError(
                f"{_OWNER}({key}=...) is not accepted: the strategy runs PyTorch FSDP2 with raylight's "
                "block policy (Lightning's FSDPStrategy options do not apply). Choose the blocks with "
                "blocks=(class names) or min_block_params=; see docs/lightning.md"
            )
        self.fsdp = fsdp_options(
            blocks=blocks,
            min_block_params=min_block_params,
            reshard_after_forward=reshard_after_forward,
            mixed_precision=mixed_precision,
            cpu_offload=cpu_offload,
            use_gpu=use_gpu,
        )
        self._sharding = _Sharding(self.fsdp)
        self._raylight_ctx: Any = None  # the worker's TrainContext, set on the worker
        super().__init__(
            cluster_environment=_environment(self.settings),
            checkpoint_io=checkpoint_io or AtomicCheckpointIO(),
        )

    def _configure_launcher(self) -> None:
        _refuse_the_old_package(self)  # called by the Trainer's constructor
        self._launcher = RayLauncher(self.settings, check_model=self.check_model)

    def check_model(self, module: nn.Module) -> None:
        """The sharding mistakes found in the driver, before Ray starts (``check_shardable``
        on the module as it is here: nothing is allocated). The blocks are checked here only
        where ``configure_model`` cannot add layers; the worker checks them again."""
        from lightning.pytorch.utilities.model_helpers import is_overridden

        options = self.fsdp if not is_overridden("configure_model", module) else self.fsdp.model_copy(update={"blocks": None})
        sharded = self.settings.scaling.max_workers > 1 or bool(options.mixed_precision or options.cpu_offload)
        check_shardable(module, options, sharded=sharded, setting=_OWNER)

    def attach_worker(self, ctx: Any, trainer: Any) -> None:
        super().attach_worker(ctx, trainer)
        # Evaluation under torch.inference_mode would leave FSDP2's gathered parameters
        # as inference tensors, and the next training step fails ("Inplace update to
        # inference tensor outside InferenceMode"); Lightning makes the same switch for
        # its own FSDPStrategy. With gloo (CPU) Lightning uses no_grad anyway.
        for loop in (trainer.fit_loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
            loop.inference_mode = False

    @property
    def is_distributed(self) -> bool:
        return True  # Lightning then adds a DistributedSampler and syncs logged values

    def setup_environment(self) -> None:
        super().setup_environment()
        # The process group is raylight's, formed before Lightning runs; only the rank
        # Lightning's rank-zero utilities read is left to set.
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def setup(self, trainer: Any) -> None:
        assert self.accelerator is not None and self.lightning_module is not None
        self.accelerator.setup(trainer)
        module = self.precision_plugin.convert_module(self.lightning_module)
        check_blocks(module, self.fsdp)
        self._sharding.wrap_model(module, device=self.root_device, world_size=self.world_size)
        self.model = _Root(module)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)
        # Built on the sharded parameters; the hook shards a full state loaded into it.
        self.optimizers = [self._sharding.wrap_optimizer(opt) for opt in self.optimizers]

    def model_to_device(self) -> None:
        assert self.lightning_module is not None
        self.lightning_module.to(self.root_device)

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Gradient accumulation: no reduce-scatter until the last micro-batch."""
        assert self.lightning_module is not None
        with self._sharding.no_sync(self.lightning_module):
            yield

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full state dict (every shard gathered, on CPU), on every rank."""
        assert self.lightning_module is not None
        return to_cpu(full_tensors(self.lightning_module.state_dict()))

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        """The full optimizer state (keyed by parameter index, as without sharding)."""
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        return to_cpu(full_tensors(optimizer.state_dict()))

    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        """All-reduce ``tensor`` in place (``"mean"``/``"avg"``, ``"sum"``, ``"max"``,
        ``"min"`` or a ``ReduceOp``), as Lightning's DDP does."""
        if not isinstance(tensor, torch.Tensor) or not dist.is_initialized():
            return tensor
        return reduce_tensor(tensor, reduce_op, group=group)

    def teardown(self) -> None:
        # Unlike Strategy.teardown, the model stays where it is: the driver's weights
        # are gathered from its shards after the entry point returns.
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def check_blocks(module: nn.Module, options: FSDP) -> None:
    """``blocks`` must name a submodule class of the LightningModule (checked here, on
    the worker, where the module is complete: ``configure_model`` may add layers)."""
    if options.blocks is None:
        return
    classes = {type(m).__name__ for m in module.modules() if m is not module}
    if not classes & set(options.blocks):
        raise ConfigError(
            f"{_OWNER}(blocks={options.blocks!r}) names no submodule of {type(module).__name__}; "
            f"its submodule classes are {sorted(classes)}"
        )


def reduce_tensor(tensor: torch.Tensor, reduce_op: Any, *, group: Any | None = None) -> torch.Tensor:
    """``tensor`` all-reduced in place; a mean is a sum divided by the world size (gloo
    has no AVG)."""
    mean = reduce_op is None or (isinstance(reduce_op, str) and reduce_op.lower() in ("mean", "avg"))
    if mean:
        op = dist.ReduceOp.SUM
    elif isinstance(reduce_op, str):
        op = getattr(dist.ReduceOp, reduce_op.upper())
    else:
        op = reduce_op
    dist.all_reduce(tensor, op=op, group=group)
    if not mean:
        return tensor
    size = dist.get_world_size(group)
    return tensor.div_(size) if torch.is_floating_point(tensor) else tensor.copy_(tensor / size)


"""RayDeepSpeedStrategy: Lightning's DeepSpeed strategy (ZeRO stages 0-3) on raylight
workers, on CPUs (gloo, DeepSpeed's CPU accelerator) and GPUs (NCCL).

It is Lightning's public ``DeepSpeedStrategy`` with raylight's launcher, environment,
root device and sampler (``_RayWorkers``) and four changes that let it run on workers
whose process group raylight has already formed, with or without GPUs:

- ``attach_worker`` sets ``DS_ACCELERATOR`` (``cpu`` or ``cuda``, the worker's device)
  in the worker process before DeepSpeed is imported there: DeepSpeed picks its
  accelerator once, at import.
- ``setup_environment`` skips Lightning's check that refuses any accelerator but CUDA
  ("The DeepSpeed strategy is only supported on CUDA GPUs"), which is the only thing
  that stops Lightning's strategy on CPU workers; ``setup_distributed`` hands DeepSpeed
  the existing process group (``deepspeed.init_distributed`` wraps it) instead of
  Lightning's, which would overwrite MASTER_ADDR/PORT with its own guesses and reject a
  CPU device (it checks device indices).
- On CPU the root device is ``cpu:0``: Lightning passes the root device's index to
  ``deepspeed.initialize`` as ``device_rank``, and DeepSpeed compares it with 0 (a plain
  ``cpu`` device has index None).
- ``driver_weights`` gathers ZeRO-3's partitioned parameters for the driver, and
  ``teardown`` leaves the model where it is so that gathering can happen after the
  entry point returns.

Checkpoints stay DeepSpeed's own (a directory per checkpoint, each rank writing its
ZeRO partitions: exact resume with ``ckpt_path``); Lightning's
``convert_zero_checkpoint_to_fp32_state_dict`` turns one into a single file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from raylight.base.exceptions import ConfigError
from raylight.config import FailureConfig
from raylight.lightning.strategies import _environment, _RayWorkers, make_settings
from raylight.storage.checkpoint import to_cpu

_OWNER = "RayDeepSpeedStrategy"
_OURS = {
    "process_group_backend": "raylight forms the process group (gloo on CPU, NCCL on GPU)",
    "timeout": "raylight's collective timeout is FailureConfig(collective_timeout_s=...)",
    "zero_optimization": "ZeRO is on; stage=0 turns its partitioning off",
}


def require_deepspeed() -> None:
    from raylight.worker.strategies.deepspeed import import_deepspeed

    try:
        import_deepspeed()
    except ImportError as exc:
        raise ImportError(
            f"{_OWNER} needs DeepSpeed: pip install 'raylight[deepspeed]' "
            f"(deepspeed and ninja); importing it failed with: {exc}"
        ) from exc


def _check_zero(
    *, stage: int | None, offload_optimizer: bool, offload_parameters: bool, config: Any, use_gpu: bool
) -> int:
    """The ZeRO stage to use; errors name ``RayDeepSpeedStrategy(argument=...)``."""
    if config is not None:
        if not isinstance(config, dict | str | os.PathLike):
            raise ConfigError(
                f"{_OWNER}(config=...) must be a DeepSpeed config dict or the path of a JSON file, "
                f"got {type(config).__name__}"
            )
        explicit = {"stage": stage is not None, "offload_optimizer": offload_optimizer,
                    "offload_parameters": offload_parameters}
        name = next((k for k, given in explicit.items() if given), None)
        if name is not None:
            raise ConfigError(
                f"{_OWNER}(config=..., {name}=...): with a DeepSpeed config, the config alone "
                f"decides ZeRO; set it in config['zero_optimization'] or drop {name}="
            )
        return 2  # Lightning's default, unused: the config is taken as it is
    stage = 2 if stage is None else stage
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ConfigError(f"{_OWNER}(stage={stage!r}): the ZeRO stage is 0, 1, 2 or 3")
    if (offload_optimizer or offload_parameters) and not use_gpu:
        name = "offload_optimizer" if offload_optimizer else "offload_parameters"
        raise ConfigError(
            f"{_OWNER}({name}=True) needs use_gpu=True: with CPU workers the optimizer state and "
            f"parameters are in CPU memory already; drop {name}"
        )
    if offload_parameters and stage != 3:
        raise ConfigError(f"{_OWNER}(offload_parameters=True) needs stage=3 (ZeRO-3 partitions the parameters)")
    if offload_optimizer and stage == 0:
        raise ConfigError(f"{_OWNER}(offload_optimizer=True) needs stage 1, 2 or 3")
    return stage


class RayDeepSpeedStrategy(_RayWorkers, DeepSpeedStrategy):
    """DeepSpeed ZeRO over ``num_workers`` raylight workers, on CPUs or GPUs; the
    Trainer stays on the driver.

    Args:
        num_workers, use_gpu, resources_per_worker, placement, threads_per_worker,
        failure, address, num_cpus_per_worker, init_hook: where and how the workers run
            (``RaySettings``).
        stage: ZeRO stage: 0 (off), 1 (optimizer state partitioned), 2 (and gradients,
            the default), 3 (and parameters).
        offload_optimizer: GPU workers: optimizer state and step in CPU memory (ZeRO-Offload).
        offload_parameters: GPU workers, stage 3: parameters in CPU memory.
        config: a DeepSpeed config (dict or JSON path) used as it is, instead of
            ``stage`` and the offload flags.
        **deepspeed_kwargs: passed to Lightning's ``DeepSpeedStrategy`` (e.g.
            ``allgather_bucket_size``, ``logging_level``, ``load_full_weights``).
    """

    strategy_name = "raylight_deepspeed"

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
        stage: int | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        config: dict[str, Any] | str | os.PathLike[str] | None = None,
        **deepspeed_kwargs: Any,
    ) -> None:
        require_deepspeed()
        for key, why in _OURS.items():
            if key in deepspeed_kwargs:
                raise ConfigError(f"{_OWNER}({key}=...) is not accepted: {why}; remove the argument")
        self.settings = make_settings(_OWNER, locals(), kwargs=deepspeed_kwargs)
        zero = _check_zero(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            config=config,
            use_gpu=use_gpu,
        )
        self._raylight_ctx: Any = None  # the worker's TrainContext, set on the worker
        super().__init__(
            cluster_environment=_environment(self.settings),
            stage=zero,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            config=os.fspath(config) if isinstance(config, os.PathLike) else config,
            **deepspeed_kwargs,
        )

    def attach_worker(self, ctx: Any, trainer: Any) -> None:
        wanted = "cuda" if ctx.device.type == "cuda" else "cpu"
        if "deepspeed" in sys.modules:  # imported before we could choose: it must agree
            from deepspeed.accelerator import get_accelerator

            found = get_accelerator().device_name()
            if found != wanted:
                raise RuntimeError(
                    f"DeepSpeed was imported in this worker before {_OWNER} ran and chose the "
                    f"{found!r} accelerator, but the worker's device is {wanted!r}; set "
                    f"DS_ACCELERATOR={wanted} in the workers' runtime_env"
                )
        else:
            os.environ.setdefault("DS_ACCELERATOR", wanted)
        super().attach_worker(ctx, trainer)

    @property
    def root_device(self) -> torch.device:
        device = super().root_device
        # Lightning hands DeepSpeed ``root_device.index`` as its device rank; a CPU
        # device needs one too.
        return torch.device("cpu", 0) if device.type == "cpu" else device

    def setup_environment(self) -> None:
        # DeepSpeedStrategy.setup_environment refuses every accelerator but CUDA; what
        # remains of it is this (Strategy.setup_environment, then the process group).
        assert self.accelerator is not None
        self.accelerator.setup_device(self.root_device)
        self.setup_distributed()

    def setup_distributed(self) -> None:
        from lightning.fabric.utilities.seed import reset_seed

        from raylight.worker.strategies.deepspeed import (
            import_deepspeed,
            quiet_deprecated_collectives,
            skip_shm_comm,
        )

        deepspeed = import_deepspeed()
        skip_shm_comm()
        quiet_deprecated_collectives()

        reset_seed()
        self.set_world_ranks()
        # The process group is raylight's: DeepSpeed wraps it rather than forming one.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), verbose=False)

    def driver_weights(self) -> dict[str, Any]:
        """The full state dict for the driver (every rank calls it): under ZeRO-3 the
        partitioned parameters are gathered for the copy."""
        assert self.lightning_module is not None
        module = self.lightning_module
        if not self.zero_stage_3:
            return to_cpu(module.state_dict())
        import deepspeed

        # one parameter at a time: the whole model of a ZeRO-3 run may not fit one GPU
        out = {}
        for key, value in module.state_dict(keep_vars=True).items():
            gathered = [value] if isinstance(value, torch.nn.Parameter) else []
            with deepspeed.zero.GatheredParameters(gathered, modifier_rank=None):
                out[key] = value.detach().to("cpu", copy=True)
        return out

    def teardown(self) -> None:
        # Unlike Strategy.teardown, the model stays where it is: the driver's weights
        # are gathered from its partitions after the entry point returns.
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()

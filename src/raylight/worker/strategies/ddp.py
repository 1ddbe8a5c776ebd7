"""Distributed data parallel: replicate the model, all-reduce (average) gradients; on CPU
workers of one machine, through shared memory (``shm_allreduce``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raylight.config.schema import DDP
from raylight.worker.strategies.base import (
    CheckpointFormat,
    ClipAtStep,
    backend_for,
    load_objects,
    materialize,
    no_sync_of,
    objects_state,
)
from raylight.worker.strategies.shm_allreduce import SharedMemoryAllReduce, comm_hook


def apply_ddp(model: nn.Module, *, device: torch.device) -> DistributedDataParallel:
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


class DDPStrategy:
    name = "ddp"
    replicated = True
    reuses_process = True

    def __init__(self, options: DDP | None = None) -> None:
        self.options = options or DDP()
        self._shared: list[SharedMemoryAllReduce] = []
        self._clip: ClipAtStep | None = None  # the last optimizer prepared with max_grad_norm

    def backend(self, use_gpu: bool) -> str:
        return backend_for(use_gpu)

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        # A meta-device model is initialised on each rank; DDP then broadcasts rank 0's.
        materialize(model, device=device, rank=0)
        if world_size == 1:
            return model.to(device)
        ddp = apply_ddp(model, device=device)
        self.share_memory_for(ddp, device)
        return ddp

    def share_memory_for(self, ddp: DistributedDataParallel, device: torch.device) -> None:
        """Average ``ddp``'s gradient buckets through shared memory where the options, the
        device and the ranks' machines allow (``shm_allreduce``); every rank calls it (a
        collective: all ranks register the hook, or none does)."""
        if self.options.shared_memory and device.type == "cpu" and dist.get_backend() == "gloo":
            shared = SharedMemoryAllReduce.create()
            if shared is not None:
                self._shared.append(shared)
                ddp.register_comm_hook(shared, comm_hook)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        if max_grad_norm is not None:
            self._clip = ClipAtStep(optimizer, max_grad_norm)
        return optimizer

    def grad_norm(self) -> float | None:
        return self._clip.value if self._clip is not None else None

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        return no_sync_of(model)

    def full_state(self, state: Any) -> Any:
        return state  # every replica holds the whole model

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        pass  # DDP needs no batch settings

    def sum_reducer(self) -> Callable[[torch.Tensor], Any] | None:
        return self._shared[-1].all_reduce_ if self._shared else None

    def close(self) -> None:
        for shared in self._shared:  # a peer still waiting in one fails now, not at the timeout
            shared.close()
        self._shared.clear()

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        return "full"

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        return objects_state(objects)

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        load_objects(objects, state, full=full)

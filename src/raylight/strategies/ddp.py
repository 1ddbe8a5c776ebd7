"""Distributed data parallel: replicate the model, all-reduce (average) gradients."""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raylight.strategies.base import (
    CheckpointFormat,
    backend_for,
    load_objects,
    materialize,
    no_sync_of,
    objects_state,
)


def apply_ddp(model: nn.Module, *, device: torch.device) -> nn.Module:
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


class DDPStrategy:
    name = "ddp"
    replicated = True
    reuses_process = True

    def backend(self, use_gpu: bool) -> str:
        return backend_for(use_gpu)

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        # A meta-device model is initialised on each rank; DDP then broadcasts rank 0's.
        materialize(model, device=device, rank=0)
        if world_size == 1:
            return model.to(device)
        return apply_ddp(model, device=device)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False) -> torch.optim.Optimizer:
        return optimizer

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        return no_sync_of(model)

    def full_state(self, state: Any) -> Any:
        return state  # every replica holds the whole model

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        pass  # DDP needs no batch settings

    def close(self) -> None:
        pass  # nothing beside the process group

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        return "full"

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        return objects_state(objects)

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        load_objects(objects, state, full=full)

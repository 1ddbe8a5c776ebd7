"""Distributed data parallel: replicate the model, all-reduce (average) gradients."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: nn.Module, *, device: torch.device) -> nn.Module:
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


class DDPStrategy:
    name = "ddp"

    @staticmethod
    def backend(use_gpu: bool) -> str:
        return "nccl" if use_gpu else "gloo"

    @staticmethod
    def wrap_model(model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        if world_size == 1:
            return model.to(device)
        return apply_ddp(model, device=device)

    @staticmethod
    def unwrap_model(model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

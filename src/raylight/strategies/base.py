"""What a data-parallel strategy is to raylight: the one interface the worker's
``TrainContext`` holds. One module per strategy; ``raylight.strategies`` maps names to them."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Protocol

import torch
from torch import nn


class Strategy(Protocol):
    """How a worker replicates or shards the model, and what a checkpoint of it is.

    A checkpoint is always *full*: the state dicts a strategy hands to ``ctx.report`` are
    turned into plain tensors (``full_state``, a collective every rank joins), and a full
    state dict loads into a wrapped model or optimizer through their own
    ``load_state_dict``. So a checkpoint written by any strategy at any world size loads
    into any other.
    """

    name: str

    def backend(self, use_gpu: bool) -> str:
        """The ``torch.distributed`` backend: ``nccl`` on GPUs, ``gloo`` on CPUs."""
        ...

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        """Move ``model`` to ``device`` and wrap (or shard) it for ``world_size`` workers."""
        ...

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside what ``wrap_model`` returned."""
        ...

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer the loop steps (built on the wrapped model's parameters)."""
        ...

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        """Skip the gradient reduction of ``model``'s backward (gradient accumulation)."""
        ...

    def full_state(self, state: Any) -> Any:
        """``state`` (nested dicts, lists, tensors) with every sharded tensor gathered into
        a plain one. Every rank calls it with the same structure."""
        ...


def backend_for(use_gpu: bool) -> str:
    return "nccl" if use_gpu else "gloo"


def no_sync_of(model: nn.Module) -> ContextManager[None]:
    """``model.no_sync()`` where the wrapper has one, else nothing to skip."""
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()

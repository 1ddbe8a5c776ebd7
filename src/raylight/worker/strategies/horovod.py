"""Horovod data parallelism: rank 0's parameters broadcast, gradients averaged by
``hvd.DistributedOptimizer`` (no DDP wrapper).

Which Horovod is ``Horovod.implementation``: real ``horovod.torch`` (initialised inside the
worker's group by ``raylight.worker.hvd.real``: rank 0 runs Horovod's rendezvous server, the
ranks join it with Horovod's gloo controller) or ``raylight.horovod`` (Horovod's API on the
worker's ``torch.distributed`` group); ``auto`` is real Horovod where it is installed.
Horovod starts on the first ``prepare_model``/``prepare_optimizer`` and shuts down in
``close`` when the loop ends. Checkpoints are full state dicts, as DDP's: each replica holds
the whole model.

Gradient accumulation: ``set_batch_layout(accumulation=k)`` makes the optimizer reduce a
gradient once ``k`` backward passes have accumulated it (Horovod's
``backward_passes_per_step``), so ``no_sync`` has nothing to skip.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager as ContextManager
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.config.schema import Horovod
from raylight.worker.strategies.base import (
    CheckpointFormat,
    backend_for,
    load_objects,
    materialize,
    objects_state,
)


def resolve_implementation(implementation: str, *, setting: str = "scaling.strategy.implementation") -> str:
    """``horovod`` or ``raylight``: ``auto`` is real Horovod where it is installed; asking
    for real Horovod where it is not is a ConfigError saying how to get it."""
    from raylight.worker.hvd.compat import horovod_installed
    from raylight.worker.hvd.real import INSTALL_HINT

    if implementation == "raylight":
        return "raylight"
    installed = horovod_installed()
    if implementation == "horovod" and not installed:
        raise ConfigError(f"{setting}: 'horovod' was asked for, but {INSTALL_HINT}")
    return "horovod" if installed else "raylight"


class HorovodStrategy:
    name = "horovod"
    replicated = True
    # Real Horovod runs a process-wide background thread and keeps its library state: a
    # process that ran it starts the next run fresh. raylight.horovod forgets an adopted
    # group at shutdown, as DDP leaves nothing behind.
    reuses_process: bool

    def __init__(self, options: Horovod | None = None) -> None:
        self.options = options or Horovod()
        self.implementation = resolve_implementation(self.options.implementation)
        self.reuses_process = self.implementation == "raylight"
        self._hvd: Any = None  # horovod.torch, or raylight.horovod's functions
        self._real: Any = None  # raylight.worker.hvd.real.RealHorovod
        self._optimizers: list[Any] = []
        self._names: dict[torch.Tensor, str] = {}  # the prepared models' parameter names
        self._models = 0
        self._passes = 1

    @property
    def hvd(self) -> Any:
        """The Horovod module in use, initialised on this worker's group."""
        if self._hvd is None:
            if self.implementation == "horovod":
                from raylight.worker.hvd.real import init_horovod

                self._real = init_horovod(
                    timeout_s=self.options.init_timeout_s, setting="scaling.strategy.init_timeout_s"
                )
                self._hvd = self._real.hvd
            else:
                from raylight.worker.hvd import basics

                basics.init()  # adopts the worker's group (a group of one without workers)
                self._hvd = _raylight_horovod()
        return self._hvd

    def sum_reducer(self) -> None:
        return None  # the process group's all-reduce

    def grad_norm(self) -> None:
        return None  # the loop clips itself (wrap_optimizer)

    def close(self) -> None:
        if self._hvd is None:
            return
        hvd, real = self._hvd, self._real
        self._hvd = self._real = None
        self._optimizers, self._names = [], {}
        if real is not None:
            real.shutdown()
        else:
            hvd.shutdown()

    def backend(self, use_gpu: bool) -> str:
        return backend_for(use_gpu)

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        materialize(model, device=device, rank=0)
        model = model.to(device)
        self._models += 1
        self._names.update({p: f"model{self._models}.{n}" for n, p in model.named_parameters()})
        if world_size > 1:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        if max_grad_norm is not None:
            raise ConfigError(
                "strategy 'horovod' does not take max_grad_norm: hvd.DistributedOptimizer reduces "
                "the gradients inside step(); clip as Horovod does: opt.synchronize(), "
                "torch.nn.utils.clip_grad_norm_(...), then `with opt.skip_synchronize(): opt.step()`"
            )
        if adaptive:  # TrainerConfig refuses it; a direct caller learns why
            raise ConfigError(
                "strategy 'horovod' cannot run adaptive training: hvd.DistributedOptimizer reduces "
                "the gradients itself; use strategy 'ddp' with adaptive=..."
            )
        hvd = self.hvd
        # Horovod names each gradient's all-reduce: unique within and across optimizers
        params = [p for group in optimizer.param_groups for p in group["params"]]
        prefix = f"opt{len(self._optimizers)}."
        named = [(prefix + self._names.get(p, f"param.{i}"), p) for i, p in enumerate(params)]
        wrapped = hvd.DistributedOptimizer(
            optimizer, named_parameters=named, backward_passes_per_step=self._passes
        )
        self._optimizers.append(wrapped)
        return wrapped

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        # The optimizer counts backward passes (backward_passes_per_step): nothing to skip.
        return contextlib.nullcontext()

    def full_state(self, state: Any) -> Any:
        return state  # every replica holds the whole model

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        self._passes = accumulation
        for optimizer in self._optimizers:
            optimizer.set_backward_passes_per_step(accumulation)

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        return "full"

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        return objects_state(_inner(objects))

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        load_objects(_inner(objects), state, full=full)


def _raylight_horovod() -> Any:
    """The ``raylight.horovod`` functions the strategy calls, from its library modules
    (the package also holds the script runner and ``hvd.elastic``, products the core does
    not use)."""
    from raylight.worker.hvd import basics, optimizer

    return SimpleNamespace(
        __name__="raylight.horovod",
        init=basics.init,
        shutdown=basics.shutdown,
        is_initialized=basics.is_initialized,
        broadcast_parameters=optimizer.broadcast_parameters,
        DistributedOptimizer=optimizer.DistributedOptimizer,
    )


def _inner(objects: dict[str, Any]) -> dict[str, Any]:
    """``objects`` with each Horovod ``DistributedOptimizer`` replaced by the plain
    optimizer under it, which torch's state-dict helpers understand (they call
    ``zero_grad(set_to_none=True)`` on a fresh optimizer, which real Horovod's lacks)."""
    from raylight.worker.hvd.optimizer import _DistributedOptimizer

    return {
        k: v.optimizer if isinstance(v, _DistributedOptimizer) else _plain(v) for k, v in objects.items()
    }


def _plain(value: Any) -> Any:
    """Real Horovod's ``DistributedOptimizer`` is an instance of a class Horovod makes on
    the fly, with the user's optimizer class as its base: the same object seen as that base
    class (its attributes shared: parameter groups, state, hooks), so its methods are the
    plain optimizer's and no gradient is all-reduced. Anything else as it is."""
    cls = type(value)
    if not (isinstance(value, torch.optim.Optimizer) and cls.__module__ == "horovod.torch.optimizer"):
        return value
    base = cls.__mro__[1]
    plain: Any = object.__new__(base)
    plain.__dict__ = value.__dict__
    return plain

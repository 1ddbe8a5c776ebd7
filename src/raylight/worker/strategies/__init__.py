"""Data-parallel strategies, one module each. ``build_strategy`` holds the only
name -> strategy map."""

from __future__ import annotations

from typing import Any

from raylight.config.schema import DDP, FSDP, DeepSpeed, Horovod
from raylight.worker.strategies.base import Strategy
from raylight.worker.strategies.ddp import DDPStrategy
from raylight.worker.strategies.deepspeed import (
    DeepSpeedStrategy,  # imports deepspeed only when used
)
from raylight.worker.strategies.fsdp import FSDPStrategy
from raylight.worker.strategies.horovod import HorovodStrategy  # imports Horovod only when used


def _ddp(options: Any) -> Strategy:
    return DDPStrategy(options if isinstance(options, DDP) else None)


def _fsdp(options: Any) -> Strategy:
    return FSDPStrategy(options if isinstance(options, FSDP) else None)


def _deepspeed(options: Any) -> Strategy:
    return DeepSpeedStrategy(options if isinstance(options, DeepSpeed) else None)


def _horovod(options: Any) -> Strategy:
    return HorovodStrategy(options if isinstance(options, Horovod) else None)


_STRATEGIES: dict[str, Any] = {
    "ddp": _ddp,
    "fsdp": _fsdp,
    "deepspeed": _deepspeed,
    "horovod": _horovod,
}


def build_strategy(spec: str | DDP | FSDP | DeepSpeed | Horovod) -> Strategy:
    """The strategy for a ``ScalingConfig.strategy`` value: a name or an options object."""
    name = spec if isinstance(spec, str) else spec.name
    try:
        make = _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(_STRATEGIES)}") from None
    return make(spec)


__all__ = ["DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy", "HorovodStrategy", "Strategy", "build_strategy"]

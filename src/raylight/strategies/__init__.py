"""Data-parallel strategies. ``build_strategy`` holds the only name -> strategy map."""

from __future__ import annotations

from raylight.strategies.ddp import DDPStrategy

_STRATEGIES = {"ddp": DDPStrategy}


def build_strategy(name: str) -> DDPStrategy:
    try:
        return _STRATEGIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of {sorted(_STRATEGIES)}"
        ) from None


__all__ = ["DDPStrategy", "build_strategy"]

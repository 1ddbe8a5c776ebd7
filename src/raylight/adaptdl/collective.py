"""``adaptdl.collective``: reductions and broadcasts of Python objects across replicas,
on torch.distributed's default group (the one ``adaptdl.torch.init_process_group`` joins).
One replica (or no group yet) returns the value itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def default_reduce_fn(a: Any, b: Any) -> Any:
    return a + b


def initialize(master_addr: str | None = None, master_port: int | None = None, replica_rank: int | None = None,
               num_replicas: int | None = None) -> None:
    """Nothing to do: the collectives use torch.distributed's default group."""


def teardown() -> None:
    """Nothing to do (the process group is the script's)."""


def allreduce(value: Any, reduce_fn: Callable[[Any, Any], Any] = default_reduce_fn) -> Any:
    """``reduce_fn`` folded over every replica's ``value``, in rank order; every replica
    gets the result (a collective: call it on every replica)."""
    if _world() == 1:
        return value
    gathered: list[Any] = [None] * _world()
    dist.all_gather_object(gathered, value)
    result = gathered[0]
    for other in gathered[1:]:
        result = reduce_fn(result, other)
    return result


class _Done:
    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self) -> Any:
        return self._value


def allreduce_async(value: Any, reduce_fn: Callable[[Any, Any], Any] = default_reduce_fn) -> _Done:
    """``allreduce``, done now; ``.result()`` gives its value (AdaptDL's future)."""
    return _Done(allreduce(value, reduce_fn))


def broadcast(value: Any) -> Any:
    """Replica 0's ``value`` on every replica."""
    if _world() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]

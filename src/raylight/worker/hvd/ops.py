"""Horovod's collectives on ``torch.distributed``, and their async handles.

Each op is one ``torch.distributed`` call on the default group (see docs/horovod.md for
the table): ``allreduce`` is ``all_reduce`` with Horovod's ops and scale factors,
``allgather`` an ``all_gather`` padded to the longest first dimension, ``broadcast`` a
``broadcast``, ``alltoall`` an ``all_to_all_single`` after the split sizes are exchanged.
An ``_async`` op starts the collective (``async_op=True``) and returns an integer handle;
``synchronize`` waits and finishes it (scaling, un-padding), ``poll`` asks whether it is
done. Unlike Horovod, ops are matched across ranks by the order they are called in, not by
``name``: every rank must start the same collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from raylight.worker.hvd.basics import (
    OP_NAMES,
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    check_process_set,
    global_process_set,
    state,
)

_TORCH_OPS = {Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}
# A broken group's errors: torch's DistError family, and gloo's socket errors, which
# reach Python as plain RuntimeErrors.
_BROKEN = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


@contextmanager
def collective() -> Iterator[None]:
    """Turn a broken group's error into Horovod's ``HorovodInternalError``."""
    try:
        yield
    except dist.DistError as exc:
        raise HorovodInternalError(f"a collective failed: {exc}") from exc
    except RuntimeError as exc:
        if isinstance(exc, HorovodInternalError) or not any(s in str(exc) for s in _BROKEN):
            raise
        raise HorovodInternalError(f"a collective failed: {exc}") from exc


@dataclass
class _Pending:
    works: list[Any]
    finish: Callable[[], Any]


def _handle(works: list[Any], finish: Callable[[], Any]) -> int:
    s = state()
    s.next_handle += 1
    s.handles[s.next_handle] = _Pending(works, finish)
    return s.next_handle


def poll(handle: int) -> bool:
    """True when the op behind ``handle`` has finished (``synchronize`` will not block)."""
    pending = state().handles.get(handle)
    if pending is None:
        raise ValueError(f"hvd.poll({handle!r}): no pending op has this handle (already synchronized?)")
    return all(w.is_completed() for w in pending.works)


def synchronize(handle: int) -> Any:
    """Wait for the op behind ``handle`` and return its result."""
    pending = state().handles.pop(handle, None)
    if pending is None:
        raise ValueError(f"hvd.synchronize({handle!r}): no pending op has this handle (already synchronized?)")
    with collective():
        for w in pending.works:
            w.wait()
    return pending.finish()


def _reduce_op(op: int | None, average: bool | None, where: str) -> int:
    if average is not None:
        if op is not None:
            raise ValueError(f"{where}: give op= or the deprecated average=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise ValueError(
            f"{where}: op=hvd.Adasum is not supported by raylight.horovod (Adasum needs Horovod's own "
            "reduction); use op=hvd.Average, or install Horovod (docs/horovod.md)"
        )
    if op not in OP_NAMES:
        raise ValueError(f"{where}: op={op!r} is not one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product")
    return op


def _scale(t: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if t.is_floating_point() or t.is_complex():
        t.mul_(factor)
    else:  # as Horovod scales integer buffers: through a double, truncated
        t.copy_((t.double() * factor).trunc().to(t.dtype))


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Start reducing ``tensor`` in place across ranks; ``synchronize`` returns it."""
    check_process_set(process_set)
    op = _reduce_op(op, average, "hvd.allreduce")
    post = postscale_factor / state().size if op == Average else postscale_factor
    _scale(tensor, prescale_factor)
    with collective():
        work = dist.all_reduce(tensor, op=_TORCH_OPS.get(op, dist.ReduceOp.SUM), async_op=True)

    def finish() -> torch.Tensor:
        _scale(tensor, post)
        return tensor

    return _handle([work], finish)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> int:
    return allreduce_async_(tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place (average by default) and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = None,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced across ranks (average by default), compressed on
    the wire with ``compression`` (``hvd.Compression.fp16``)."""
    from raylight.worker.hvd.optimizer import Compression

    codec = compression or Compression.none
    wire, ctx = codec.compress(tensor.detach().clone())
    out = synchronize(allreduce_async_(wire, average, name, op, prescale_factor, postscale_factor, process_set))
    return codec.decompress(out, ctx)


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = global_process_set) -> list[torch.Tensor]:
    handles = [allreduce_async(t, average, name, op, prescale_factor, postscale_factor, process_set) for t in tensors]
    return [synchronize(h) for h in handles]


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> list[torch.Tensor]:
    handles = [allreduce_async_(t, average, name, op, prescale_factor, postscale_factor, process_set) for t in tensors]
    return [synchronize(h) for h in handles]


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> int:
    """Start gathering every rank's ``tensor``, concatenated along the first dimension
    (which may differ between ranks; the others must match)."""
    check_process_set(process_set)
    t = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    n = state().size
    with collective():
        lengths = [torch.zeros(1, dtype=torch.int64, device=t.device) for _ in range(n)]
        dist.all_gather(lengths, torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device))
        sizes = [int(x.item()) for x in lengths]
        longest = max(sizes)
        padded = t
        if t.shape[0] < longest:
            padded = torch.cat([t, t.new_zeros((longest - t.shape[0], *t.shape[1:]))])
        parts = [torch.empty_like(padded) for _ in range(n)]
        work = dist.all_gather(parts, padded.contiguous(), async_op=True)
    return _handle([work], lambda: torch.cat([p[:k] for p, k in zip(parts, sizes, strict=True)]))


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> torch.Tensor:
    return synchronize(allgather_async(tensor, name, process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = global_process_set) -> int:
    """Start overwriting ``tensor`` with rank ``root_rank``'s, in place."""
    check_process_set(process_set)
    _check_root(root_rank, "hvd.broadcast")
    with collective():
        work = dist.broadcast(tensor, src=root_rank, async_op=True)
    return _handle([work], lambda: tensor)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = global_process_set) -> int:
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def _check_root(root_rank: int, where: str) -> None:
    n = state().size
    if not isinstance(root_rank, int) or not 0 <= root_rank < n:
        raise ValueError(f"{where}: root_rank={root_rank!r} is not a rank of this job (0..{n - 1})")


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = global_process_set) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` (in order) to rank ``i``; without
    ``splits`` the first dimension is divided evenly. ``synchronize`` returns the rows
    received, concatenated in rank order, and, when ``splits`` was given, how many came
    from each rank."""
    check_process_set(process_set)
    n = state().size
    t = tensor.detach().contiguous()
    if splits is None:
        if t.shape[0] % n:
            raise ValueError(
                f"hvd.alltoall: the first dimension ({t.shape[0]}) does not divide evenly among {n} ranks; pass splits="
            )
        send = [t.shape[0] // n] * n
    else:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(send) != n or any(s < 0 for s in send) or sum(send) != t.shape[0]:
            raise ValueError(
                f"hvd.alltoall: splits={send} must hold {n} non-negative counts summing to the first "
                f"dimension ({t.shape[0]})"
            )
    with collective():
        recv_t = torch.empty(n, dtype=torch.int64, device=t.device)
        dist.all_to_all_single(recv_t, torch.tensor(send, dtype=torch.int64, device=t.device))
        recv = [int(x) for x in recv_t.tolist()]
        out = t.new_empty((sum(recv), *t.shape[1:]))
        work = dist.all_to_all_single(out, t, recv, send, async_op=True)

    def finish() -> Any:
        return out if splits is None else (out, torch.tensor(recv, dtype=torch.int32))

    return _handle([work], finish)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = global_process_set) -> Any:
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None, op: int | None = None,
                  process_set: Any = global_process_set) -> torch.Tensor:
    """``tensor`` reduced across ranks (average by default), this rank's slice of the
    first dimension (the first ``dim0 % size`` ranks get one row more, as in Horovod)."""
    reduced = allreduce(tensor, op=Average if op is None else op, process_set=process_set)
    n, r = state().size, state().rank
    rows = [reduced.shape[0] // n + (1 if i < reduced.shape[0] % n else 0) for i in range(n)]
    start = sum(rows[:r])
    return reduced[start : start + rows[r]].clone()


def barrier(process_set: Any = global_process_set) -> None:
    check_process_set(process_set)
    with collective():
        dist.barrier()


def join(device: int = -1) -> int:
    """Wait for every rank to call ``join``; returns the rank that called it last.
    Unlike Horovod, ranks that joined do not stand in with zeros for the collectives of
    ranks still working: every rank must run the same collectives (docs/horovod.md)."""
    import time

    state()
    with collective():
        stamps = [None] * state().size
        dist.all_gather_object(stamps, time.time())
    return max(range(len(stamps)), key=lambda i: (stamps[i], i))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = global_process_set) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (pickled, as torch's
    ``broadcast_object_list``)."""
    check_process_set(process_set)
    _check_root(root_rank, "hvd.broadcast_object")
    box = [obj if state().rank == root_rank else None]
    with collective():
        dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    check_process_set(process_set)
    out: list[Any] = [None] * state().size
    with collective():
        dist.all_gather_object(out, obj)
    return out

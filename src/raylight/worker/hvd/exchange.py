"""Horovod's ``alltoall`` and ``reducescatter`` (single, grouped, async) on
``torch.distributed``, after the ranks agree on the op (``agree.py``), as ``ops.py``'s.

``alltoall``: the split sizes exchanged by ``all_to_all_single``, then the rows.
``reducescatter``: gloo has no reduce-scatter, so an ``all_reduce`` of the whole tensor
(scaled by ``prescale_factor``), then this rank's rows (the first ``dim0 % size`` ranks of
the set get one more, as in Horovod), scaled by ``postscale_factor`` (and ``1/size`` for
``Average``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from raylight.worker.hvd.agree import Op, agree
from raylight.worker.hvd.basics import global_process_set, group_of, state
from raylight.worker.hvd.ops import (
    _handle,
    _needs_grad,
    _reduction,
    _refusal,
    collective,
    start_allreduce,
    synchronize,
    wire,
)


def _send_splits(t: torch.Tensor, splits: Any, n: int) -> tuple[list[int] | None, ValueError | None]:
    where = "hvd.alltoall"
    if splits is None:
        if t.dim() == 0 or t.shape[0] % n:
            first = t.shape[0] if t.dim() else "a scalar"
            return None, ValueError(f"{where}: the first dimension ({first}) does not divide evenly among {n} "
                                    "ranks; pass splits=")
        return [t.shape[0] // n] * n, None
    if isinstance(splits, torch.Tensor) and splits.dtype not in (torch.int32, torch.int64):
        return None, ValueError(f"{where}: splits must hold integers (int32), got {splits.dtype}")
    send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(send) != n or any(s < 0 for s in send) or t.dim() == 0 or sum(send) != t.shape[0]:
        return None, ValueError(f"{where}: splits={send} must hold {n} non-negative counts summing to the first "
                                f"dimension ({t.shape[0] if t.dim() else 'a scalar'})")
    return send, None


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = global_process_set) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` (in order) to rank ``i`` of the set;
    without ``splits`` the first dimension is divided evenly. ``synchronize`` returns the
    rows received, concatenated in rank order, and how many came from each rank (when
    ``splits`` was given; both, always, from ``alltoall``)."""
    where = "hvd.alltoall"
    group, n, _ = group_of(process_set, where)
    refusal = _refusal([tensor], where, name)
    send: list[int] | None = None
    if refusal is None:
        send, refusal = _send_splits(tensor, splits, n)
    agree(Op("alltoall", [tensor], name=name, ignore_dim0=True), where, refusal, group)
    assert send is not None
    t = wire(tensor.detach().contiguous())
    with collective():
        recv_t = torch.empty(n, dtype=torch.int64)
        dist.all_to_all_single(recv_t, torch.tensor(send, dtype=torch.int64), group=group)
        recv = [int(x) for x in recv_t.tolist()]
        out = t.new_empty((sum(recv), *t.shape[1:]))
        work = dist.all_to_all_single(out, t, recv, send, group=group, async_op=True)

    def finish() -> Any:
        got = out.to(tensor.dtype)
        return got if splits is None else (got, torch.tensor(recv, dtype=torch.int32))

    return _handle([work], finish, name)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = global_process_set) -> Any:
    """The rows every rank sent this one and, with ``splits``, how many came from each
    (``(tensor, received_splits)``, as Horovod); differentiable."""
    if isinstance(tensor, torch.Tensor) and _needs_grad(tensor):
        from raylight.worker.hvd.grad import alltoall_grad

        return alltoall_grad(tensor, splits, name, process_set)
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def _rows(dim0: int, n: int, r: int) -> tuple[int, int]:
    rows = [dim0 // n + (1 if i < dim0 % n else 0) for i in range(n)]
    return sum(rows[:r]), rows[r]


def _reducescatter_start(tensors: list[torch.Tensor], name: str | None, op: int | None, prescale: float,
                         postscale: float, process_set: Any, where: str, grouped: bool) -> int:
    group, n, r = group_of(process_set, where)
    op, refusal = _reduction(op, None, tensors, where, name)
    if refusal is None and any(t.dim() == 0 for t in tensors):
        refusal = ValueError(f"{where}: a scalar (0-dimensional tensor) cannot be scattered; give it a first dimension")
    agree(Op("reducescatter", tensors, op=op, name=name), where, refusal, group)
    copies = [t.detach().clone() for t in tensors]
    handle = start_allreduce(copies, op, prescale, postscale, group, n, name)
    pending = state().handles[handle]
    reduce_all = pending.finish

    def finish() -> Any:
        out = []
        for t in reduce_all():
            start, count = _rows(t.shape[0], n, r)
            out.append(t[start : start + count].clone())
        return out if grouped else out[0]

    pending.finish = finish
    return handle


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int | None = None,
                        process_set: Any = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    return _reducescatter_start([tensor], name, op, prescale_factor, postscale_factor, process_set,
                                "hvd.reducescatter", grouped=False)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None, op: int | None = None,
                  process_set: Any = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """``tensor`` reduced across ranks (average by default), this rank's slice of the
    first dimension; differentiable."""
    from raylight.worker.hvd.optimizer import Compression

    if isinstance(tensor, torch.Tensor) and _needs_grad(tensor):
        from raylight.worker.hvd.grad import reducescatter_grad

        return reducescatter_grad(tensor, name, op, process_set, prescale_factor, postscale_factor)
    codec = compression or Compression.none
    sent, ctx = codec.compress(tensor) if isinstance(tensor, torch.Tensor) else (tensor, None)
    out = synchronize(reducescatter_async(sent, name, op, process_set, prescale_factor, postscale_factor))
    return codec.decompress(out, ctx)


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None, op: int | None = None,
                                process_set: Any = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    return _reducescatter_start(list(tensors), name, op, prescale_factor, postscale_factor, process_set,
                                "hvd.grouped_reducescatter", grouped=True)


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None, compression: Any = None,
                          op: int | None = None, process_set: Any = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Each of ``tensors`` reduce-scattered as ``reducescatter`` does one; differentiable."""
    if _needs_grad(*tensors):
        from raylight.worker.hvd.grad import grouped_reducescatter_grad

        return grouped_reducescatter_grad(list(tensors), name, op, process_set, prescale_factor, postscale_factor)
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor))

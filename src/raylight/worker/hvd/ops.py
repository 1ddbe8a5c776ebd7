"""Horovod's collectives on ``torch.distributed``, and their async handles.

Each op is one ``torch.distributed`` call on the process set's group (see docs/horovod.md
for the table): ``allreduce`` is ``all_reduce`` with Horovod's ops and scale factors,
``allgather`` an ``all_gather`` padded to the longest first dimension, ``broadcast`` a
``broadcast`` (``alltoall`` and ``reducescatter``: ``exchange.py``). Before it, the ranks
agree on what they run (``agree.py``): a mismatch or a refused input raises the same error
on every rank, and the group stays in step. An ``_async`` op starts the collective
(``async_op=True``) and returns an integer handle; ``synchronize`` waits and finishes it
(scaling, un-padding), ``poll`` asks whether it is done. Unlike Horovod, ops are matched
across ranks by the order they are called in, not by ``name``: every rank must start the
same collectives in the same order. Tensors that require grad go through ``grad.py``'s
autograd functions, as Horovod's do. int16, which gloo refuses, travels as int32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from raylight.worker.hvd.agree import JOIN, Op, agree, exchange, join_row, stand_in
from raylight.worker.hvd.basics import (
    OP_NAMES,
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    global_process_set,
    group_of,
    state,
)
from raylight.worker.process_group import RENDEZVOUS_TIMEOUT_ENV

_TORCH_OPS = {Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}
# A broken group's errors: torch's DistError family, and gloo's socket errors, which
# reach Python as plain RuntimeErrors.
_BROKEN = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
_WIDER = {torch.int16: torch.int32}  # dtypes gloo refuses ("Invalid scalar type"), carried wider


@contextmanager
def collective() -> Iterator[None]:
    """Turn a broken group's error into Horovod's ``HorovodInternalError``."""
    try:
        yield
    except dist.DistError as exc:
        late = " (a rank did not reach it in time: the group's timeout is " \
            f"{RENDEZVOUS_TIMEOUT_ENV})" if "timed out" in str(exc).lower() else ""
        raise HorovodInternalError(f"a collective failed{late}: {exc}") from exc
    except RuntimeError as exc:
        if isinstance(exc, HorovodInternalError) or not any(s in str(exc) for s in _BROKEN):
            raise
        raise HorovodInternalError(f"a collective failed: {exc}") from exc


@dataclass
class _Pending:
    works: list[Any]
    finish: Callable[[], Any]
    name: str | None


def _handle(works: list[Any], finish: Callable[[], Any], name: str | None = None) -> int:
    s = state()
    s.next_handle += 1
    s.handles[s.next_handle] = _Pending(works, finish, name)
    return s.next_handle


def _duplicate(name: str | None, where: str) -> ValueError | None:
    if name is not None and any(p.name == name for p in state().handles.values()):
        return ValueError(f"{where}: an op named {name!r} is still pending; synchronize it before reusing the name")
    return None


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


def reduce_op(op: int | None, average: bool | None, where: str) -> int:
    if average is not None:
        if op is not None:
            raise ValueError(f"{where}: give op= or the deprecated average=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise NotImplementedError(
            f"{where}: op=hvd.Adasum is not supported by raylight.horovod (Adasum needs Horovod's own "
            "reduction); use op=hvd.Average, or real Horovod (docs/horovod.md)"
        )
    if op not in OP_NAMES:
        raise ValueError(f"{where}: op={op!r} is not one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product")
    return op


_reduce_op = reduce_op  # the optimizer's name for it


def scale(t: torch.Tensor, factor: float) -> None:
    """``t *= factor`` as Horovod scales: integers through a double, truncated; float16 on
    the CPU through float32."""
    if factor == 1.0:
        return
    if t.dtype == torch.float16 and not t.is_cuda:
        t.copy_((t.float() * factor).half())
    elif t.is_floating_point() or t.is_complex():
        t.mul_(factor)
    else:
        t.copy_((t.double() * factor).trunc().to(t.dtype))


def wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype gloo carries (itself, or a wider copy)."""
    wider = _WIDER.get(t.dtype)
    return t if wider is None or t.is_cuda else t.to(wider)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _check_tensor(t: Any, where: str) -> ValueError | None:
    if not isinstance(t, torch.Tensor):
        return ValueError(f"{where}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        return ValueError(f"{where}: sparse tensors are reduced by hvd.sparse_allreduce_async, not here")
    return None


def _refusal(tensors: Sequence[Any], where: str, name: str | None, extra: Exception | None = None) -> Exception | None:
    for t in tensors:
        err = _check_tensor(t, where)
        if err is not None:
            return err
    return extra or _duplicate(name, where)


def _reduction(op: int | None, average: bool | None, tensors: Sequence[Any], where: str,
               name: str | None) -> tuple[int, Exception | None]:
    """A reduction's op and what refuses its input, if anything: an op raylight lacks
    (Adasum) is a refusal too, agreed on as Average so that every rank raises it."""
    try:
        return reduce_op(op, average, where), _refusal(tensors, where, name)
    except NotImplementedError as exc:
        return Average, exc


# ---- allreduce ---------------------------------------------------------------------------


def start_allreduce(tensors: list[torch.Tensor], op: int, prescale: float, postscale: float, group: Any,
                    group_size: int, name: str | None = None) -> int:
    """Reduce ``tensors`` in place (already agreed on); one handle for all of them."""
    post = postscale / group_size if op == Average else postscale
    bufs = []
    for t in tensors:
        scale(t, prescale)
        bufs.append(wire(t))
    with collective():
        works = [dist.all_reduce(b, op=_TORCH_OPS.get(op, dist.ReduceOp.SUM), group=group, async_op=True)
                 for b in bufs]

    def finish() -> list[torch.Tensor]:
        for t, b in zip(tensors, bufs, strict=True):
            if b is not t:
                t.copy_(b)
            scale(t, post)
        return tensors

    return _handle(works, finish, name)


def _allreduce_start(tensors: list[torch.Tensor], average: bool | None, name: str | None, op: int | None,
                     prescale: float, postscale: float, process_set: Any, where: str, grouped: bool) -> int:
    group, n, _ = group_of(process_set, where)
    op, refusal = _reduction(op, average, tensors, where, name)
    agree(Op("allreduce", tensors, op=op, name=name), where, refusal, group)
    handle = start_allreduce(tensors, op, prescale, postscale, group, n, name)
    if not grouped:
        pending = state().handles[handle]
        inner = pending.finish
        pending.finish = lambda: inner()[0]
    return handle


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> int:
    """Start reducing ``tensor`` in place across ranks; ``synchronize`` returns it."""
    return _allreduce_start([tensor], average, name, op, prescale_factor, postscale_factor, process_set,
                            "hvd.allreduce", grouped=False)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> int:
    copy = tensor.detach().clone() if isinstance(tensor, torch.Tensor) else tensor
    return allreduce_async_(copy, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place (average by default) and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, compression: Any = None,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set) -> torch.Tensor:
    """A new tensor: ``tensor`` reduced across ranks (average by default), compressed on
    the wire with ``compression`` (``hvd.Compression.fp16``); differentiable."""
    from raylight.worker.hvd.optimizer import Compression

    if isinstance(tensor, torch.Tensor) and _needs_grad(tensor):
        from raylight.worker.hvd.grad import allreduce_grad

        return allreduce_grad(tensor, average, name, compression, op, prescale_factor, postscale_factor, process_set)
    codec = compression or Compression.none
    data = tensor.detach().clone() if isinstance(tensor, torch.Tensor) else tensor
    sent, ctx = codec.compress(data) if isinstance(data, torch.Tensor) else (data, None)
    out = synchronize(allreduce_async_(sent, average, name, op, prescale_factor, postscale_factor, process_set))
    return codec.decompress(out, ctx)


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = global_process_set) -> int:
    return _allreduce_start(list(tensors), average, name, op, prescale_factor, postscale_factor, process_set,
                            "hvd.grouped_allreduce", grouped=True)


def grouped_allreduce_async(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = global_process_set) -> int:
    copies = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = None, op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = global_process_set) -> list[torch.Tensor]:
    """New tensors: each of ``tensors`` reduced across ranks; differentiable."""
    if _needs_grad(*tensors):
        from raylight.worker.hvd.grad import grouped_allreduce_grad

        return grouped_allreduce_grad(list(tensors), average, name, op, prescale_factor, postscale_factor,
                                      process_set)
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor,
                                               process_set))


# ---- allgather ---------------------------------------------------------------------------


def _allgather_start(tensors: list[torch.Tensor], name: str | None, process_set: Any, where: str,
                     grouped: bool) -> int:
    group, n, _ = group_of(process_set, where)
    refusal = _refusal(tensors, where, name)
    flat = [t.detach().reshape(1) if isinstance(t, torch.Tensor) and t.dim() == 0 else t for t in tensors]
    agree(Op("allgather", flat, name=name, ignore_dim0=True), where, refusal, group)
    with collective():
        mine = torch.tensor([t.shape[0] for t in flat], dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(rows, mine, group=group)
        sizes = torch.stack(rows).tolist()  # sizes[rank][tensor]
        works, parts_of = [], []
        for i, t in enumerate(flat):
            longest = max(r[i] for r in sizes)
            sent = wire(t.detach())
            if sent.shape[0] < longest:
                sent = torch.cat([sent, sent.new_zeros((longest - sent.shape[0], *sent.shape[1:]))])
            parts = [torch.empty_like(sent) for _ in range(n)]
            works.append(dist.all_gather(parts, sent.contiguous(), group=group, async_op=True))
            parts_of.append(parts)

    def finish() -> Any:
        out = [torch.cat([p[: r[i]] for p, r in zip(parts, sizes, strict=True)]).to(t.dtype)
               for i, (t, parts) in enumerate(zip(flat, parts_of, strict=True))]
        return out if grouped else out[0]

    return _handle(works, finish, name)


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> int:
    """Start gathering every rank's ``tensor``, concatenated along the first dimension
    (which may differ between ranks; the others must match)."""
    return _allgather_start([tensor], name, process_set, "hvd.allgather", grouped=False)


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> torch.Tensor:
    if isinstance(tensor, torch.Tensor) and _needs_grad(tensor):
        from raylight.worker.hvd.grad import allgather_grad

        return allgather_grad(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: Any = global_process_set) -> int:
    return _allgather_start(list(tensors), name, process_set, "hvd.grouped_allgather", grouped=True)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: Any = global_process_set) -> list[torch.Tensor]:
    """Each of ``tensors`` gathered as ``allgather`` gathers one; differentiable."""
    if _needs_grad(*tensors):
        from raylight.worker.hvd.grad import grouped_allgather_grad

        return grouped_allgather_grad(list(tensors), name, process_set)
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast ---------------------------------------------------------------------------


def check_root(root_rank: Any, where: str, members: list[int] | None = None) -> ValueError | None:
    ranks = members if members is not None else list(range(state().size))
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank not in ranks:
        return ValueError(f"{where}: root_rank={root_rank!r} is not a rank of this process set ({ranks})")
    return None


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = global_process_set) -> int:
    """Start overwriting ``tensor`` with rank ``root_rank``'s, in place."""
    where = "hvd.broadcast"
    group, _, _ = group_of(process_set, where)
    members = None if process_set is global_process_set else process_set.ranks
    refusal = _refusal([tensor], where, name, check_root(root_rank, where, members))
    root = root_rank if isinstance(root_rank, int) else -1
    agree(Op("broadcast", [tensor], root=root, name=name), where, refusal, group)
    buf = wire(tensor)
    with collective():
        work = dist.broadcast(buf, src=root_rank, group=group, async_op=True)

    def finish() -> torch.Tensor:
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    return _handle([work], finish, name)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = global_process_set) -> int:
    copy = tensor.detach().clone() if isinstance(tensor, torch.Tensor) else tensor
    return broadcast_async_(copy, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor``, as a new tensor on every rank; differentiable."""
    if isinstance(tensor, torch.Tensor) and _needs_grad(tensor):
        from raylight.worker.hvd.grad import broadcast_grad

        return broadcast_grad(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# ---- the rest ----------------------------------------------------------------------------


def barrier(process_set: Any = global_process_set) -> None:
    group, _, _ = group_of(process_set, "hvd.barrier")
    agree(Op("barrier"), "hvd.barrier", None, group)
    with collective():
        dist.barrier(group=group)


def join(device: int = -1) -> int:
    """Wait for every rank to call ``join``; returns the rank that called it last. As in
    Horovod, while it waits this rank takes part in the others' allreduces (of one tensor
    each), adding zeros; any other op they run raises on them (docs/horovod.md)."""
    import time

    s = state()
    if s.size == 1:
        return 0
    waited, entered = 0, int(time.time() * 1000)
    while True:
        rows = exchange(join_row(waited, entered))
        if all(row[0] == JOIN for row in rows):  # the last to arrive waited least
            return min(range(len(rows)), key=lambda i: (rows[i][1], -rows[i][2], -i))
        zeros = stand_in(rows)
        if zeros is not None:
            synchronize(start_allreduce([zeros[0]], zeros[1], 1.0, 1.0, None, s.size))
        waited += 1


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = global_process_set) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (pickled, as torch's
    ``broadcast_object_list``)."""
    group, _, _ = group_of(process_set, "hvd.broadcast_object")
    members = None if process_set is global_process_set else process_set.ranks
    refusal = check_root(root_rank, "hvd.broadcast_object", members)
    agree(Op("broadcast", root=root_rank if isinstance(root_rank, int) else -1, name=name),
          "hvd.broadcast_object", refusal, group)
    box = [obj if state().rank == root_rank else None]
    with collective():
        dist.broadcast_object_list(box, src=root_rank, group=group)
    return box[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    group, n, _ = group_of(process_set, "hvd.allgather_object")
    agree(Op("allgather", name=name), "hvd.allgather_object", None, group)
    out: list[Any] = [None] * n
    with collective():
        dist.all_gather_object(out, obj, group=group)
    return out


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: int | None = Average,
                           process_set: Any = global_process_set) -> Callable[[], torch.Tensor]:
    """Start reducing a sparse (COO) tensor as Horovod does: every rank's indices and
    values all-gathered; the returned handle is a function giving the sparse sum
    (``Sum``) or average (``Average``)."""
    where = "hvd.sparse_allreduce_async"
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError(f"{where}: expected a sparse (COO) tensor; reduce dense ones with hvd.allreduce_async")
    op = reduce_op(op, None, where)
    if op not in (Average, Sum):
        raise ValueError(f"{where}: op must be hvd.Average or hvd.Sum, got {OP_NAMES.get(op, op)}")
    _, n, _ = group_of(process_set, where)
    t = tensor.coalesce()
    handle = _allgather_start([t.indices().t().contiguous(), t.values().contiguous()], name, process_set, where,
                              grouped=True)

    def result() -> torch.Tensor:
        indices, values = synchronize(handle)
        if op == Average:
            values = values / n
        return torch.sparse_coo_tensor(indices.t(), values, t.shape)

    return result

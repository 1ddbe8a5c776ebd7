"""Differentiable collectives: what ``hvd.allreduce`` & co. return for a tensor that
requires grad, as Horovod's autograd functions (``horovod/torch/mpi_ops.py``) define their
gradients. Each backward is itself a collective, so every rank must call ``backward``.

- allreduce: the gradient reduced the same way (op, scale factors);
- allgather: the gradient averaged, then this rank's rows;
- broadcast: the gradient averaged on the root, zeros elsewhere;
- alltoall: the gradient sent back (the received splits become the sent ones);
- reducescatter: the gradient gathered (times the set's size for ``Sum``, as Horovod's).
"""

from __future__ import annotations

from typing import Any

import torch

from raylight.worker.hvd.basics import Average, Sum, group_of


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, average: Any, name: Any, op: Any, pre: float, post: float,
                process_set: Any) -> torch.Tensor:
        from raylight.worker.hvd.ops import allreduce, reduce_op

        ctx.args = (reduce_op(op, average, "hvd.allreduce"), pre, post, process_set)
        return allreduce(tensor.detach(), average, name, None, op, pre, post, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import allreduce

        op, pre, post, process_set = ctx.args
        out = allreduce(grad.contiguous(), None, None, None, op, pre, post, process_set)
        return out, None, None, None, None, None, None


def allreduce_grad(tensor: torch.Tensor, average: Any, name: Any, compression: Any, op: Any, pre: float,
                   post: float, process_set: Any) -> torch.Tensor:
    if compression is not None and getattr(compression, "__name__", "") != "NoneCompressor":
        from raylight.worker.hvd.optimizer import Compression

        sent, cctx = compression.compress(tensor)
        out = _Allreduce.apply(sent, average, name, op, pre, post, process_set)
        return compression.decompress(out, cctx) if compression is not Compression.none else out
    return _Allreduce.apply(tensor, average, name, op, pre, post, process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, args: tuple[Any, ...], *tensors: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import grouped_allreduce, reduce_op

        average, name, op, pre, post, process_set = args
        ctx.args = (reduce_op(op, average, "hvd.grouped_allreduce"), pre, post, process_set)
        return tuple(grouped_allreduce([t.detach() for t in tensors], average, name, None, op, pre, post,
                                       process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import grouped_allreduce

        op, pre, post, process_set = ctx.args
        return (None, *grouped_allreduce([g.contiguous() for g in grads], None, None, None, op, pre, post,
                                         process_set))


def grouped_allreduce_grad(tensors: list[torch.Tensor], average: Any, name: Any, op: Any, pre: float, post: float,
                           process_set: Any) -> list[torch.Tensor]:
    return list(_GroupedAllreduce.apply((average, name, op, pre, post, process_set), *tensors))


def _my_rows(grad: torch.Tensor, dims: list[int], r: int) -> torch.Tensor:
    start = sum(dims[:r])
    return grad.narrow(0, start, dims[r])


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, args: tuple[Any, Any], *tensors: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import grouped_allgather

        name, process_set = args
        ctx.process_set = process_set
        out = grouped_allgather([t.detach() for t in tensors], name, process_set)
        ctx.dims = [int(t.shape[0]) if t.dim() else 1 for t in tensors]
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import grouped_allgather, grouped_allreduce

        process_set = ctx.process_set
        _, _, r = group_of(process_set, "hvd.allgather's gradient")
        reduced = grouped_allreduce([g.contiguous() for g in grads], None, None, None, Average, 1.0, 1.0, process_set)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims], None, process_set)
        return (None, *[_my_rows(g, d.tolist(), r) for g, d in zip(reduced, dims, strict=True)])


def allgather_grad(tensor: torch.Tensor, name: Any, process_set: Any) -> torch.Tensor:
    out: torch.Tensor = _Allgather.apply((name, process_set), tensor)[0]
    return out


def grouped_allgather_grad(tensors: list[torch.Tensor], name: Any, process_set: Any) -> list[torch.Tensor]:
    return list(_Allgather.apply((name, process_set), *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Any, process_set: Any) -> torch.Tensor:
        from raylight.worker.hvd.ops import broadcast

        ctx.root, ctx.process_set = root_rank, process_set
        return broadcast(tensor.detach(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from raylight.worker.hvd.basics import rank
        from raylight.worker.hvd.ops import allreduce

        reduced = allreduce(grad.contiguous(), None, None, None, Average, 1.0, 1.0, ctx.process_set)
        return (reduced if rank() == ctx.root else reduced * 0), None, None, None


def broadcast_grad(tensor: torch.Tensor, root_rank: int, name: Any, process_set: Any) -> torch.Tensor:
    out: torch.Tensor = _Broadcast.apply(tensor, root_rank, name, process_set)
    return out


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Any, process_set: Any) -> Any:
        from raylight.worker.hvd.exchange import alltoall

        _, n, _ = group_of(process_set, "hvd.alltoall")
        given = splits is not None
        # the backward sends the gradient back as it came: it needs the received splits
        even = splits if given else ([tensor.shape[0] // n] * n if tensor.dim() and tensor.shape[0] % n == 0 else None)
        out, received = alltoall(tensor.detach(), even, name, process_set) if even is not None \
            else (alltoall(tensor.detach(), None, name, process_set), None)
        ctx.received, ctx.process_set = received, process_set
        if given:
            ctx.mark_non_differentiable(received)
            return out, received
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> Any:
        from raylight.worker.hvd.exchange import alltoall

        back, _ = alltoall(grad.contiguous(), ctx.received, None, ctx.process_set)
        return back, None, None, None


def alltoall_grad(tensor: torch.Tensor, splits: Any, name: Any, process_set: Any) -> Any:
    return _Alltoall.apply(tensor, splits, name, process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, args: tuple[Any, ...], *tensors: torch.Tensor) -> Any:
        from raylight.worker.hvd.exchange import grouped_reducescatter
        from raylight.worker.hvd.ops import reduce_op

        name, op, process_set, pre, post = args
        op = reduce_op(op, None, "hvd.reducescatter")
        ctx.args = (op, process_set, pre, post)
        return tuple(grouped_reducescatter([t.detach() for t in tensors], name, None, op, process_set, pre, post))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        from raylight.worker.hvd.ops import grouped_allgather, scale

        op, process_set, pre, post = ctx.args
        _, n, _ = group_of(process_set, "hvd.reducescatter's gradient")
        gathered = grouped_allgather([g.contiguous() for g in grads], None, process_set)
        factor = pre * post * (n if op == Sum else 1)  # Horovod's convention (its tests check it)
        for g in gathered:
            scale(g, factor)
        return (None, *gathered)


def reducescatter_grad(tensor: torch.Tensor, name: Any, op: Any, process_set: Any, pre: float,
                       post: float) -> torch.Tensor:
    out: torch.Tensor = _Reducescatter.apply((name, op, process_set, pre, post), tensor)[0]
    return out


def grouped_reducescatter_grad(tensors: list[torch.Tensor], name: Any, op: Any, process_set: Any, pre: float,
                               post: float) -> list[torch.Tensor]:
    return list(_Reducescatter.apply((name, op, process_set, pre, post), *tensors))


"""``hvd.DistributedOptimizer``, ``hvd.Compression`` and the state broadcasts.

``DistributedOptimizer`` wraps the user's optimizer without patching it: a
``torch.optim.Optimizer`` that shares the wrapped one's ``param_groups``, ``state`` and
``defaults`` (so LR schedulers and ``state_dict`` see one optimizer) and, as Horovod's,
starts an async all-reduce of each parameter's gradient as soon as backward has
accumulated it ``backward_passes_per_step`` times (``register_post_accumulate_grad_hook``),
so communication overlaps the rest of backward. ``step()`` waits for them
(``synchronize``) and steps the wrapped optimizer. The reductions start in one fixed order
on every rank (the parameters' order reversed, which is about the order backward produces
them), never in the order the hooks fire: a gradient that is ready waits for those before
it in that order, so ranks whose backward passes reach the parameters in different orders
(or not at all: they reduce zeros at ``synchronize``) still run the same collectives in the
same order, as torch.distributed matches them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from raylight.worker.hvd.basics import (
    Average,
    ProcessSet,
    global_process_set,
    group_of,
    state,
)
from raylight.worker.hvd.ops import (
    _reduce_op,
    broadcast_async_,
    broadcast_object,
    sparse_allreduce_async,
    start_allreduce,
    synchronize,
)
from raylight.worker.wrapped_optimizer import WrappedOptimizer


class NoneCompressor:
    """No compression."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor:
    """Floating-point tensors travel as float16 and come back in their own dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """Horovod's gradient compression choices."""

    none = NoneCompressor
    fp16 = FP16Compressor


class _DistributedOptimizer(WrappedOptimizer):
    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: int, gradient_predivide_factor: float,
                 sparse_as_dense: bool, process_set: Any = global_process_set) -> None:
        super().__init__(optimizer)  # the wrapped optimizer's groups and state, shared
        self._process_set = process_set  # a rank outside it keeps its own gradients, as in Horovod
        self._compression = compression
        self._op = op
        self._bpps = backward_passes_per_step
        self._sparse_as_dense = sparse_as_dense
        if op == Average:  # split as Horovod does; Average divides by the size on top
            self._prescale, self._postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
        else:
            self._prescale = self._postscale = 1.0
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self._params = params
        self._names = _names(params, named_parameters)
        self._delay = {p: backward_passes_per_step for p in params}
        self._order = list(reversed(params))  # the one order every rank reduces in
        self._next = 0  # self._order[:self._next] are started
        self._ready: set[torch.Tensor] = set()
        self._densified: set[torch.Tensor] = set()  # sparse gradients reduced as dense (sparse_as_dense)
        self._handles: dict[torch.Tensor, tuple[Any, Any]] = {}
        self._should_sync = True
        self._synchronized = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def _on_grad(self, p: torch.Tensor) -> None:
        if p in self._handles or p in self._ready:
            raise AssertionError(
                f"gradient of {self._names[p]} was computed more than backward_passes_per_step="
                f"{self._bpps} times before optimizer.step() or optimizer.synchronize(); raise "
                "backward_passes_per_step or call step() after each backward"
            )
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._ready.add(p)
            while self._next < len(self._order) and self._order[self._next] in self._ready:
                self._start(self._order[self._next])

    def _start(self, p: torch.Tensor) -> None:
        self._handles[p] = self._reduce(p)
        self._next += 1

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:  # Horovod's attribute (its tests read it)
        return self._names

    def _reduce(self, p: torch.Tensor) -> tuple[Any, Any]:
        if p.grad is None:  # a parameter this backward did not reach: it contributes zeros
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:  # as Horovod: indices and values all-gathered
                return sparse_allreduce_async(grad, op=self._op, process_set=self._process_set), None
            p.grad = grad = grad.to_dense()
            self._densified.add(p)  # back to sparse once reduced (SparseAdam takes sparse ones only)
        if not self._process_set.included():
            return None, (grad, grad, None)
        wire, ctx = self._compression.compress(grad)
        group, n, _ = group_of(self._process_set, "hvd.DistributedOptimizer")
        handle = start_allreduce([wire], self._op, self._prescale, self._postscale, group, n)
        return handle, (grad, wire, ctx)

    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce (starting those no hook started) and put
        the reduced gradients in place."""
        while self._next < len(self._order):
            self._start(self._order[self._next])
        for p in self._order:
            handle, held = self._handles[p]
            if held is None:  # a sparse gradient's reduction
                p.grad = handle()
                continue
            grad, _, ctx = held
            if handle is None:  # this rank is not in the optimizer's process set
                continue
            out = self._compression.decompress(synchronize(handle)[0], ctx)
            if out is not grad:
                grad.copy_(out)
        for p in self._densified:
            p.grad = p.grad.to_sparse() if p.grad is not None else None
        self._densified.clear()
        self._handles.clear()
        self._ready.clear()
        self._next = 0
        self._delay = {p: self._bpps for p in self._params}
        self._synchronized = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Reduce each gradient once ``passes`` backward passes accumulated it (Horovod's
        method of the same name); counts already under way start again."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step={passes!r}: expected an int >= 1")
        self._bpps = passes
        self._delay = {p: passes for p in self._params}
        self._ready.clear()

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this block does not synchronize (call ``synchronize()``
        yourself first, e.g. to clip the reduced gradients)."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure: Any = None) -> Any:
        if self._should_sync:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(); the gradients are not reduced again (Horovod's warning)",
                    stacklevel=2,
                )
            else:
                self.synchronize()
        self._synchronized = False
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                "or optimizer.synchronize(): the gradients are still being reduced"
            )
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ValueError("hvd.DistributedOptimizer: add parameter groups to the optimizer before wrapping it")

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"


def _names(params: list[torch.Tensor], named_parameters: Any) -> dict[torch.Tensor, str]:
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters must be (name, parameter) pairs, e.g. model.named_parameters()")
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters: parameter names must be unique; repeated: {dups}")
    by_param = {p: n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if p not in by_param]
    if unnamed:
        raise ValueError(
            f"named_parameters was given but {len(unnamed)} of the optimizer's parameters are not in it "
            "(pass model.named_parameters() of the model the optimizer trains)"
        )
    return {p: by_param[p] for p in params}


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
) -> torch.optim.Optimizer:
    """``optimizer`` whose ``step()`` first averages (``op``) every gradient across ranks.
    ``num_groups``/``groups`` (Horovod's fusion grouping) change no result and are ignored."""
    state()
    if process_set is not global_process_set and not isinstance(process_set, ProcessSet):
        raise ValueError(f"hvd.DistributedOptimizer: process_set={process_set!r} is not an hvd.ProcessSet")
    op = _reduce_op(op, None, "hvd.DistributedOptimizer")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("hvd.DistributedOptimizer: the optimizer is already a DistributedOptimizer")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step!r}: expected an int >= 1")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor!r}: expected a positive number")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=hvd.Average (as in Horovod)")
    return _DistributedOptimizer(optimizer, named_parameters, compression, backward_passes_per_step, op,
                                 gradient_predivide_factor, sparse_as_dense, process_set)


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite, in place, every tensor of ``params`` (a ``state_dict()``, or
    ``named_parameters()``/``parameters()``) with rank ``root_rank``'s."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    handles = []
    for _, p in items:
        if not isinstance(p, torch.Tensor):
            continue
        target = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(target, root_rank))
    for handle in handles:
        synchronize(handle)


def _in_cpu_memory(state_dict: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's ``state_dict`` with its per-parameter tensors in CPU memory."""
    per_param = {
        i: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for i, s in state_dict["state"].items()
    }
    return {**state_dict, "state": per_param}


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Horovod's way to give a fresh optimizer its state (momentum buffers, ...): zero
    gradients where there are none, one ``step()`` of the plain optimizer (every rank
    takes the same step from the same, broadcast, parameters)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    optimizer.step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank rank ``root_rank``'s optimizer state and hyper-parameters (its
    ``state_dict``, sent as one object)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("hvd.broadcast_optimizer_state: torch.optim.LBFGS is not supported (as in Horovod)")
    inner = optimizer.optimizer if isinstance(optimizer, _DistributedOptimizer) else optimizer
    if not inner.state:  # as Horovod: a step on zero gradients creates the state to send
        _create_state(inner)
    # sent from CPU memory: pickled GPU tensors would be rebuilt on the root's GPU index on
    # every rank; load_state_dict moves each to its parameter's device
    root_state = broadcast_object(_in_cpu_memory(inner.state_dict()) if state().rank == root_rank else None, root_rank)
    if state().rank != root_rank:
        inner.load_state_dict(root_state)

"""AdaptiveOptimizer: accumulation, the LR rule and gradient statistics, explicitly.

It wraps the user's optimizer without patching it. The loop calls ``zero_grad``,
``backward`` and ``step`` on every micro-batch as usual; with ``s`` accumulation steps,
``zero_grad`` only clears at the first micro-step of an optimizer step and ``step`` only
steps at the last one, after dividing the summed gradients by ``s + 1``. The learning rate
of each param group is multiplied by the rule's factor for that one step and restored, so
the user's schedulers keep working on the unscaled rate.

Gradient statistics for the noise scale are measured on the steps ``StepSync`` marks
(one in ``every``): with several replicas the loader runs the whole step without DDP's
all-reduce, and the optimizer takes the local gradient's norm, all-reduces the gradients
itself in one flat tensor, with StepSync's control vector at its end (so the control
step needs no collective of its own), and takes the averaged gradient's norm; with one replica, the
gradients of the micro-steps are compared through a snapshot (with no accumulation, two
consecutive steps are, which is biased because the parameters moved in between).
Adam-family optimizers precondition by sqrt(v_hat) + eps before norms are taken. Other
steps pay nothing.

An optimizer whose engine holds the gradients (``EngineGradients``: DeepSpeed, whose ZeRO
partitions and reduces them inside backward and averages a step's micro-steps itself) is
stepped at the last micro-step only; on a measured step every rank sums the squared norms
of its own micro-batch gradients, seen by per-parameter hooks before the engine reduces
them, and compares their mean with the norm of the step's reduced gradient, which the
engine computes. These norms are not preconditioned (the engine's Adam state is
partitioned), so for Adam the noise is the plain gradient's. One worker without
accumulation has one micro-batch a step and measures nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from raylight.base.exceptions import ConfigError
from raylight.worker.adaptive.sync import StepSync
from raylight.worker.wrapped_optimizer import WrappedOptimizer


def _is_adam(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW | torch.optim.NAdam | torch.optim.RAdam)


@runtime_checkable
class EngineGradients(Protocol):
    """An optimizer whose engine holds the gradients and averages a step's micro-steps
    itself (``raylight.worker.strategies.deepspeed.DeepSpeedOptimizer``)."""

    def on_local_gradient(self, hook: Callable[[torch.Tensor], None]) -> None:
        """Call ``hook`` with every parameter's gradient of each backward, this rank's,
        before the engine reduces it, divided by the step's micro-step count."""

    def reduced_sqr_norm(self) -> float | None:
        """The squared norm of the gradient the last step applied, or None."""


class AdaptiveOptimizer(WrappedOptimizer):
    """What ``ctx.prepare_optimizer`` returns in an adaptive run (a ``WrappedOptimizer``:
    torch's LR schedulers take it; hooks registered on it run when the wrapped optimizer
    steps, at a step's last micro-step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, sync: StepSync) -> None:
        if isinstance(optimizer, AdaptiveOptimizer):
            raise TypeError("this optimizer was already prepared with ctx.prepare_optimizer")
        super().__init__(optimizer)
        self.sync = sync
        sync.carrier = True  # its control-step all-reduce carries StepSync's control vector
        self._adam = _is_adam(optimizer)
        self._snapshot: list[torch.Tensor] | None = None  # one replica: gradients so far
        self._micro_sqr = 0.0
        self._groups: dict[int, dict[str, Any]] | None = None
        self._engine = optimizer if isinstance(optimizer, EngineGradients) else None
        self._local_sqr: torch.Tensor | float = 0.0  # engine: this step's local micro-batch norms
        if self._engine is not None:
            self._engine.on_local_gradient(self._local_gradient)

    # -- the optimizer interface the loop uses ------------------------------------------
    @property
    def progress(self) -> float:
        """Scale-invariant progress, in optimizer steps at the initial batch size."""
        return self.sync.progress

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.sync.micro == 0:
            self.optimizer.zero_grad(set_to_none=set_to_none)
            self._snapshot = None if not self.sync.as_one else self._snapshot
            self._micro_sqr = 0.0

    # torch.amp.GradScaler gives an optimizer that declares this its scale and inf check
    # (grad_scale, found_inf) and leaves its gradients scaled: how step learns one drives it.
    _step_supports_amp_scaling = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if getattr(self, "found_inf", None) is not None:
            for name in ("found_inf", "grad_scale"):  # GradScaler's, which it removes only after a step
                self.__dict__.pop(name, None)
            raise ConfigError(
                "torch.amp.GradScaler does not work with adaptive training: its step() and update() "
                "run at every micro-step of an accumulation, unscaling and rescaling the gradients "
                "being accumulated. Use bfloat16 autocast, which needs no scaler "
                "(torch.autocast(device, dtype=torch.bfloat16)), or train without adaptive="
            )
        if closure is not None:  # (Lightning) the closure makes the gradients: run it first
            with torch.enable_grad():
                loss = closure()
            self._step()
            return loss
        return self._step()

    def _step(self) -> Any:
        sync = self.sync
        last = sync.micro == sync.micro_steps - 1
        if self._engine is not None:
            return self._engine_step(last)
        if sync.as_one and sync.measuring:
            self._measure_micro_step(last)
        if not last:
            return None  # accumulating: the gradients stay for the next micro-step
        agreed = self._allreduce_and_measure() if not sync.as_one and sync.measuring else None
        if sync.micro_steps > 1:
            for grad in self._grads():
                grad.div_(sync.micro_steps)
        out = self._scaled_step()
        if agreed is not None:
            sync.received(agreed)  # the step is done: the next one may change
        return out

    def _scaled_step(self) -> Any:
        """The wrapped optimizer's step at the rule's LR factor (each group's rate restored
        after it), and the progress it makes."""
        factor = self.sync.lr_factor()
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * factor
        try:
            out = self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
                group["lr"] = lr
        self.sync.advance_progress()
        return out

    @property
    def _engine_measuring(self) -> bool:
        """Whether this step is measured (one in ``every``: micro-batches of several ranks or
        micro-steps compare without StepSync's second, consecutive step)."""
        sync = self.sync
        return sync.measuring and sync.phase == 0 and sync.uniform_step and sync.micro_steps * sync.world_size > 1

    def _local_gradient(self, grad: torch.Tensor) -> None:
        if self._engine_measuring:
            self._local_sqr = self._local_sqr + grad.detach().float().pow(2).sum()

    def _engine_step(self, last: bool) -> Any:
        """An engine's step (module docstring): at the last micro-step only; on a measured
        step, this rank's mean micro-batch norm against the reduced gradient's."""
        if not last:
            return None
        assert self._engine is not None
        sync = self.sync
        out = self._scaled_step()
        steps, measured = sync.micro_steps, self._local_sqr
        self._local_sqr = 0.0
        if self._engine_measuring:
            big = self._engine.reduced_sqr_norm()
            if big is not None:
                # the hooks saw each micro-batch's gradient divided by `steps`: their summed
                # squares times steps**2 / steps is the mean squared micro-batch norm
                sync.set_grad_stats(
                    small_sqr=float(measured) * steps,
                    big_sqr=big,
                    small_batch=sync.plan.atomic_bsz,
                    big_batch=sync.plan.atomic_bsz * steps * sync.world_size,
                )
        return out

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._groups = None

    def __getattr__(self, name: str) -> Any:  # anything else: the wrapped optimizer's
        if name == "optimizer":  # not set yet (a copy being made): not the wrapped one's
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    # -- gradient statistics ---------------------------------------------------------------
    def _params(self) -> Iterator[torch.Tensor]:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield p

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self._params() if p.grad is not None]

    def _group_of(self, p: torch.Tensor) -> dict[str, Any]:
        if self._groups is None:  # built once: parameter -> its param group
            self._groups = {id(q): g for g in self.optimizer.param_groups for q in g["params"]}
        return self._groups[id(p)]

    def _adam_denominator(self, p: torch.Tensor) -> torch.Tensor | None:
        """Adam's sqrt(v_hat) + eps for ``p``, or None before its first step."""
        state = self.optimizer.state.get(p, {})
        if "exp_avg_sq" not in state or "step" not in state:
            return None
        group = self._group_of(p)
        # no float(): a fused or capturable Adam keeps step on the GPU (a sync per parameter)
        v_hat = state["exp_avg_sq"] / (1 - group["betas"][1] ** state["step"])
        return v_hat.sqrt() + group["eps"]

    def preconditioned_sqr(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> float:
        """Sum of squared (preconditioned, for Adam) gradient entries; one sync at the end."""
        if not self._adam:
            return sqr_norm(grads)
        parts = []
        for g, p in zip(grads, params, strict=True):
            denom = self._adam_denominator(p)
            parts.append(g.detach() if denom is None else g.detach() / denom)
        return sqr_norm(parts)

    def _allreduce_and_measure(self) -> list[float]:
        """Average the (unsynchronised) gradients over replicas in one flat all-reduce
        that also carries StepSync's control vector, measuring the local and the averaged
        squared norms around it. Returns the summed control vector."""
        sync = self.sync
        params = list(self._params())
        grads = [p.grad for p in params if p.grad is not None]
        outgoing = sync.take_outgoing()
        device = grads[0].device if grads else sync.device
        # At least float32: the control slots hold integers (plan sizes) exactly.
        dtype = torch.float32
        for g in grads:
            dtype = torch.promote_types(dtype, g.dtype)
        numel = sum(g.numel() for g in grads)
        flat = torch.empty(numel + len(outgoing), dtype=dtype, device=device)
        offset = 0
        for g in grads:
            flat[offset : offset + g.numel()].copy_(g.reshape(-1))
            offset += g.numel()
        body = flat[:numel]
        scale = self._preconditioner(params, dtype) if self._adam else None
        local = _sqr(body, scale)
        body.div_(sync.world_size)
        flat[numel:] = torch.tensor(outgoing, dtype=dtype)
        sync.reduce_sum(flat)
        offset = 0
        for g in grads:
            g.copy_(body[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        agreed = flat[numel:].tolist()
        if grads and sync.uniform_step:
            big = _sqr(body, scale)
            steps = sync.micro_steps
            sync.set_grad_stats(
                small_sqr=local / steps**2,
                big_sqr=big / steps**2,
                small_batch=sync.plan.atomic_bsz * steps,
                big_batch=sync.plan.atomic_bsz * steps * sync.world_size,
            )
        return agreed

    def _preconditioner(self, params: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """1 / (sqrt(v_hat) + eps) for each gradient entry, flat, in ``params`` order (1
        where Adam has no state yet)."""
        parts = []
        for p in params:
            denom = self._adam_denominator(p)
            if denom is None:
                parts.append(torch.ones(p.numel(), dtype=dtype, device=p.device))
            else:
                parts.append((1.0 / denom).reshape(-1).to(dtype))
        return torch.cat(parts) if parts else torch.ones(0, dtype=dtype)

    def _measure_micro_step(self, last: bool) -> None:
        """One replica, or a group whose gradients are sharded (FSDP: each micro-step is
        reduced, so what this rank holds is its shard of the group's gradient, of
        ``world_size`` micro-batches): the gradient of this micro-step is the total so far
        minus the snapshot; compare micro-step norms with the norm of their mean (norms of
        sharded tensors are taken over the whole tensor)."""
        sync = self.sync
        atomic = sync.plan.atomic_bsz * sync.world_size
        params = list(self._params())
        if not sync.uniform_step or not params:
            self._snapshot = None
            return
        totals = [g.detach().clone() for g in self._grads()]
        steps = sync.micro_steps
        if steps > 1:
            prev = self._snapshot if self._snapshot is not None and sync.micro > 0 else None
            micro = [t - s for t, s in zip(totals, prev, strict=True)] if prev is not None else totals
            self._micro_sqr += self.preconditioned_sqr(micro, params)
            self._snapshot = totals
            if last:
                mean = [t / steps for t in totals]
                sync.set_grad_stats(
                    small_sqr=self._micro_sqr / steps,
                    big_sqr=self.preconditioned_sqr(mean, params),
                    small_batch=atomic,
                    big_batch=atomic * steps,
                )
            return
        # No accumulation: a step against the one before it (biased): snapshot the first.
        if sync.phase == 0:
            self._snapshot = totals
            return
        prev, self._snapshot = self._snapshot, None
        if prev is None or len(prev) != len(totals):
            return
        mean = [(t + s) / 2 for t, s in zip(totals, prev, strict=True)]
        sync.set_grad_stats(
            small_sqr=(self.preconditioned_sqr(totals, params) + self.preconditioned_sqr(prev, params)) / 2,
            big_sqr=self.preconditioned_sqr(mean, params),
            small_batch=atomic,
            big_batch=2 * atomic,
        )


def _sqr(flat: torch.Tensor, scale: torch.Tensor | None) -> float:
    """Sum of squares of ``flat`` (times ``scale``, entry by entry): one dot product."""
    if flat.numel() == 0:
        return 0.0
    v = flat if scale is None else flat * scale
    return float(torch.dot(v, v))


def sqr_norm(tensors: list[torch.Tensor]) -> float:
    """Sum of squares of all entries, with one device sync."""
    if not tensors:
        return 0.0
    norm = torch.nn.utils.get_total_norm([t.detach() for t in tensors], norm_type=2.0)
    full = getattr(norm, "full_tensor", None)  # sharded (DTensor) gradients: the whole norm
    return float(full() if callable(full) else norm) ** 2

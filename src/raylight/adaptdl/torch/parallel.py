"""``adaptdl.torch.AdaptiveDataParallel``: torch's DDP, with AdaptDL's patch of the user's
optimizer (scripts keep calling ``optimizer.step()`` and ``optimizer.zero_grad()`` on their
own object, as AdaptDL's tutorial does).

Under an AdaptiveDataLoader the patched ``zero_grad`` clears only at an optimizer step's
first micro-step and ``step`` steps only at its last (gradient accumulation), after
dividing the summed gradients by the micro-step count and multiplying the learning rate
by the scaling rule's factor for that one step (the user's scheduler sees the unscaled
rate). A DDP communication hook takes the squared norms of the local and the averaged
gradient of each step, from which raylight's noise estimator
(``raylight.adaptive.noise``) measures the gradient noise the adaptive engine and
AdaScale's gain (``model.gain``) need. The model, optimizer, scheduler, the scaler and the
noise estimate are a checkpointed ``State``.

Mixed precision (``mp_scaler=``, torch's ``GradScaler``): the script keeps calling
``scaler.scale(loss).backward()``, ``scaler.step(optimizer)`` and ``scaler.update()`` at
every micro-step, as AdaptDL's CIFAR example does. The scaler is patched in place like the
optimizer: at an accumulation micro-step its ``unscale_``, ``step`` and ``update`` do
nothing (the partial sum stays scaled, at one scale), and at the last one the summed
gradient is unscaled once, the step is skipped where any micro-step on any replica gave an
inf or nan (the replicas agree first: an all-reduce of each one's finding), and the scale
is updated once, alike on every replica. The noise measurement divides out the scale.
"""

from __future__ import annotations

import functools
from types import MethodType
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from raylight.adaptdl import checkpoint
from raylight.adaptdl.torch.data import current_dataloader
from raylight.adaptdl.torch.scaling_rules import AdamScale, AdaScale, ScalingRuleBase
from raylight.adaptive.goodput import GradParams, gain
from raylight.adaptive.lr import progress_increment
from raylight.adaptive.noise import NoiseScaleEstimator


class AdaptiveDataParallel(DistributedDataParallel):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None,
                 mp_scaler: Any = None, scaling_rule: ScalingRuleBase | None = None,
                 name: str = "adaptdl-dataparallel", **kwargs: Any) -> None:
        if mp_scaler is not None and not isinstance(mp_scaler, torch.amp.GradScaler):
            raise TypeError(f"AdaptiveDataParallel(mp_scaler={type(mp_scaler).__name__}): expected a torch.amp.GradScaler "
                            "(or torch.cuda.amp.GradScaler), or None for no loss scaling")
        if not dist.is_initialized():
            raise RuntimeError("AdaptiveDataParallel: call adaptdl.torch.init_process_group(backend) first")
        _contiguous_buffers(model)
        super().__init__(model, **kwargs)
        is_adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
        self.scaling_rule = scaling_rule or (AdamScale() if is_adam else AdaScale())
        self.adaptdl_optimizer = optimizer
        self._replicas = dist.get_world_size()
        self._local_sqr = torch.zeros((), dtype=torch.float64)
        self._reduced_sqr = torch.zeros((), dtype=torch.float64)
        self.register_comm_hook(None, self._noise_hook)
        self._state = _ParallelState(model, optimizer, lr_scheduler, mp_scaler, name)
        checkpoint.load_state(self._state)
        _patch(optimizer, self)
        # A disabled scaler (enabled=False; torch.cuda.amp's where CUDA is not) only steps.
        self.mp_scaler = mp_scaler if mp_scaler is not None and mp_scaler.is_enabled() else None
        self._unscaled = False  # the scaler's unscale_ ran at this optimizer step's last micro-step
        if self.mp_scaler is not None:
            _patch_scaler(self.mp_scaler, self)

    @property
    def gain(self) -> float:
        """AdaScale's gain of the last step: its progress in steps at the initial batch."""
        return self._state.gain

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        loader = current_dataloader()
        if loader is not None and torch.is_grad_enabled() and self.training:
            loader.training = True
            loader.noise = self._state.noise
            self.require_backward_grad_sync = loader.is_optim_step()  # DDP's no_sync, per micro-step
        return super().forward(*args, **kwargs)

    def _noise_hook(self, _state, bucket):  # DDP refuses string annotations here: none
        buf = bucket.buffer()
        self._local_sqr += buf.detach().double().pow(2).sum().cpu()
        fut = dist.all_reduce(buf.div_(self._replicas), async_op=True).get_future()

        def reduced(f: torch.futures.Future[Any]) -> torch.Tensor:
            out: torch.Tensor = f.value()[0]
            self._reduced_sqr += out.detach().double().pow(2).sum().cpu()
            return out

        return fut.then(reduced)

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        if tag_prefix and not tag_prefix.endswith("/"):
            tag_prefix += "/"
        writer.add_scalar(tag_prefix + "Gain", self.gain, global_step)
        writer.add_scalar(tag_prefix + "Learning_Rate_Factor", self._state.lr_factor, global_step)

    # -- the patched optimizer's two calls -----------------------------------------------
    def _zero_grad(self, original: Any, *args: Any, **kwargs: Any) -> None:
        loader = current_dataloader()
        if loader is None or not loader.training or loader._micro == 0:
            original(*args, **kwargs)

    def _step(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        loader = current_dataloader()
        if loader is None or not loader.training:
            return original(*args, **kwargs)
        if loader.is_accum_step():
            return None
        count = loader._micro_count
        loss_scale = float(self.mp_scaler.get_scale()) if self.mp_scaler is not None else 1.0
        local_sqr, reduced_sqr = float(self._local_sqr) / loss_scale**2, float(self._reduced_sqr) / loss_scale**2
        self._local_sqr.zero_()
        self._reduced_sqr.zero_()
        if count > 1:
            for group in self.adaptdl_optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(count)
        state = self._state
        atomic = loader.current_local_bsz
        if self._replicas > 1:
            mean_local = torch.tensor([local_sqr], dtype=torch.float64)
            dist.all_reduce(mean_local)
            state.noise.update(small_sqr=float(mean_local) / self._replicas / count**2, small_batch=atomic * count,
                               big_sqr=reduced_sqr / count**2, big_batch=atomic * count * self._replicas)
        scale = atomic * count * self._replicas / loader.batch_size
        grad = state.noise.grad_params(loader.batch_size) if state.noise.ready else GradParams(1.0, 0.0)
        state.gain = float(gain(scale, grad))
        rule = self.scaling_rule
        if hasattr(rule, "init_batch_size"):
            rule.init_batch_size = loader.batch_size
        state.lr_factor = rule.factor(scale, state.gain, state.progress)
        groups = self.adaptdl_optimizer.param_groups
        base = [g["lr"] for g in groups]
        for g, lr in zip(groups, base, strict=True):
            g["lr"] = lr * state.lr_factor
        try:
            result = original(*args, **kwargs)
        finally:
            for g, lr in zip(groups, base, strict=True):
                g["lr"] = lr
        state.progress += progress_increment(rule.rule or "linear", scale, state.gain)  # type: ignore[arg-type]
        return result


    # -- the patched scaler's three calls (mp_scaler=) ------------------------------------
    def _in_accumulation(self) -> bool | None:
        """None outside an AdaptiveDataLoader's training, else whether this micro-step accumulates."""
        loader = current_dataloader()
        return None if loader is None or not loader.training else loader.is_accum_step()

    def _agree_on_inf(self) -> None:
        """Every replica skips the step where any found an inf or nan in its gradient: each
        one's finding is all-reduced, and a replica that found none, where another did,
        poisons its own gradient (which the skipped step discards) so that its scaler finds
        one too, skips and backs off alike."""
        grads = [p.grad for g in self.adaptdl_optimizer.param_groups for p in g["params"] if p.grad is not None]
        local = bool(grads) and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        found = torch.tensor([float(local)])
        if self._replicas > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        if found.item() and not local:
            grads[0].fill_(float("nan"))

    def _scaler_unscale(self, original: Any, optimizer: torch.optim.Optimizer) -> None:
        accumulating = self._in_accumulation()
        if accumulating:
            return  # the partial sum stays scaled: unscaled once, at the last micro-step
        if accumulating is not None and optimizer is self.adaptdl_optimizer and not self._unscaled:
            self._agree_on_inf()
            self._unscaled = True
        original(optimizer)

    def _scaler_step(self, original: Any, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        accumulating = self._in_accumulation()
        if accumulating is None or optimizer is not self.adaptdl_optimizer:
            return original(optimizer, *args, **kwargs)
        if accumulating:
            return None
        if not self._unscaled:
            self._agree_on_inf()
            self._unscaled = True  # its own unscale_ (the patched one) agrees no second time
        try:
            return original(optimizer, *args, **kwargs)  # skips optimizer.step where it found an inf
        finally:
            self._unscaled = False
            self._local_sqr.zero_()  # a skipped step's norms are not measured
            self._reduced_sqr.zero_()

    def _scaler_update(self, original: Any, new_scale: Any = None) -> None:
        if not self._in_accumulation():
            original(new_scale)


def _contiguous_buffers(model: torch.nn.Module) -> None:
    """A buffer whose strides are not the plain ones (a transposed view such as PyTorch's
    own tutorial's positional encoding, ``pe.unsqueeze(0).transpose(0, 1)``, in AdaptDL's
    transformer example, whose size-1 dimension keeps a large stride) copied to plain
    strides, the same values: DDP's buffer broadcast refuses it on torch 2.13
    ("some elements of the input tensor and the written-to tensor refer to a single
    memory location")."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.stride() != torch.empty(buf.shape, device="meta").stride():
                module._buffers[name] = buf.clone(memory_format=torch.contiguous_format)


def _patch_scaler(scaler: torch.amp.GradScaler, adp: AdaptiveDataParallel) -> None:
    """The script's own scaler object unscales, steps and updates once per optimizer step."""
    unscale, step, update = scaler.unscale_, scaler.step, scaler.update

    @functools.wraps(unscale)
    def patched_unscale(_self: Any, optimizer: torch.optim.Optimizer) -> None:
        adp._scaler_unscale(unscale, optimizer)

    @functools.wraps(step)
    def patched_step(_self: Any, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        return adp._scaler_step(step, optimizer, *args, **kwargs)

    @functools.wraps(update)
    def patched_update(_self: Any, new_scale: Any = None) -> None:
        adp._scaler_update(update, new_scale)

    scaler.unscale_ = MethodType(patched_unscale, scaler)  # type: ignore[method-assign]
    scaler.step = MethodType(patched_step, scaler)  # type: ignore[method-assign]
    scaler.update = MethodType(patched_update, scaler)  # type: ignore[method-assign]


def _patch(optimizer: torch.optim.Optimizer, adp: AdaptiveDataParallel) -> None:
    """AdaptDL's contract: the script's own optimizer object steps the adaptive way."""
    step, zero_grad = optimizer.step, optimizer.zero_grad

    @functools.wraps(step)
    def patched_step(_self: Any, *args: Any, **kwargs: Any) -> Any:
        return adp._step(step, *args, **kwargs)

    @functools.wraps(zero_grad)
    def patched_zero_grad(_self: Any, *args: Any, **kwargs: Any) -> None:
        adp._zero_grad(zero_grad, *args, **kwargs)

    optimizer.step = MethodType(patched_step, optimizer)  # type: ignore[method-assign]
    optimizer.zero_grad = MethodType(patched_zero_grad, optimizer)  # type: ignore[method-assign]


class _ParallelState(checkpoint.State):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 mp_scaler: torch.amp.GradScaler | None, name: str) -> None:
        super().__init__(name)
        self.model, self.optimizer, self.lr_scheduler, self.mp_scaler = model, optimizer, lr_scheduler, mp_scaler
        self.noise = NoiseScaleEstimator()
        self.gain, self.lr_factor, self.progress = 1.0, 1.0, 0.0

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "mp_scaler": None if self.mp_scaler is None else self.mp_scaler.state_dict(),
            "noise": self.noise.state_dict(), "gain": self.gain, "progress": self.progress,
        }, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        saved = torch.load(fileobj, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.lr_scheduler is not None and saved["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(saved["lr_scheduler"])
        if self.mp_scaler is not None and saved.get("mp_scaler") is not None:
            self.mp_scaler.load_state_dict(saved["mp_scaler"])
        self.noise.load_state_dict(saved["noise"])
        self.gain, self.progress = float(saved["gain"]), float(saved["progress"])

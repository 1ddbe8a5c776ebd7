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
AdaScale's gain (``model.gain``) need. The model, optimizer, scheduler and the noise
estimate are a checkpointed ``State``.
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

MP_SCALER_REFUSAL = (
    "AdaptiveDataParallel(mp_scaler=...): mixed precision with torch's GradScaler is not supported by "
    "raylight's AdaptDL layer (its gradient-noise measurement and accumulated steps would need the scaler's "
    "unscale on every micro-step); drop mp_scaler (train in float32, or bfloat16 autocast, which needs no "
    "scaler), or train with raylight.fit(..., adaptive=...), see docs/adaptdl.md"
)


class AdaptiveDataParallel(DistributedDataParallel):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None,
                 mp_scaler: Any = None, scaling_rule: ScalingRuleBase | None = None,
                 name: str = "adaptdl-dataparallel", **kwargs: Any) -> None:
        if mp_scaler is not None:
            raise NotImplementedError(MP_SCALER_REFUSAL)
        if not dist.is_initialized():
            raise RuntimeError("AdaptiveDataParallel: call adaptdl.torch.init_process_group(backend) first")
        super().__init__(model, **kwargs)
        is_adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
        self.scaling_rule = scaling_rule or (AdamScale() if is_adam else AdaScale())
        self.adaptdl_optimizer = optimizer
        self._replicas = dist.get_world_size()
        self._local_sqr = torch.zeros((), dtype=torch.float64)
        self._reduced_sqr = torch.zeros((), dtype=torch.float64)
        self.register_comm_hook(None, self._noise_hook)
        self._state = _ParallelState(model, optimizer, lr_scheduler, name)
        checkpoint.load_state(self._state)
        _patch(optimizer, self)

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
        local_sqr, reduced_sqr = float(self._local_sqr), float(self._reduced_sqr)
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
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any, name: str) -> None:
        super().__init__(name)
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.noise = NoiseScaleEstimator()
        self.gain, self.lr_factor, self.progress = 1.0, 1.0, 0.0

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "noise": self.noise.state_dict(), "gain": self.gain, "progress": self.progress,
        }, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        saved = torch.load(fileobj, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.lr_scheduler is not None and saved["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(saved["lr_scheduler"])
        self.noise.load_state_dict(saved["noise"])
        self.gain, self.progress = float(saved["gain"]), float(saved["progress"])

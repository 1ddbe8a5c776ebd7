"""``trainer.optimizer.type`` -> the torch optimizer the declarative loop steps.

Most types are one torch class. Three need more than a class (docs/declarative.md,
"Optimizers"):

- ``muon``: torch.optim.Muon orthogonalises the update of a 2-D weight matrix only, so the
  2-D weights go to Muon and every other parameter (biases, norms' scales, embeddings'
  1-D parts) to AdamW at the same rate, as Muon's authors and most users split them
  (Ludwig's own Muon steps the 1-D ones by momentum SGD instead). ``SplitOptimizer`` steps
  both as one optimizer: one list of ``param_groups`` (so a rate schedule sets both), one
  state dict.
- ``schedule_free_adamw``: the schedulefree package's AdamWScheduleFree keeps two points
  and trains at one, evaluates at the other: ``train_mode``/``eval_mode`` switch the
  weights (the loop calls them around each epoch's training and before an evaluation or a
  saved state).
- ``lbfgs``: torch's LBFGS evaluates the loss several times in one step, through a closure
  (``takes_closure``); the loop passes one (``train.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from raylight.declarative.config.trainer import CLOSURE_OPTIMIZERS, OptimizerConfig


def _muon(params: Iterable[torch.nn.Parameter], lr: float = 1e-3, **kwargs: Any) -> torch.optim.Optimizer:
    """torch.optim.Muon for the 2-D parameters, AdamW (torch's defaults, the same rate and
    weight decay) for the others; either left out when it has none. ``lr``'s default is
    torch's Muon's."""
    params = [p for p in params if p.requires_grad]
    matrices, others = [p for p in params if p.ndim == 2], [p for p in params if p.ndim != 2]
    parts: list[torch.optim.Optimizer] = []
    if matrices:
        parts.append(torch.optim.Muon(matrices, lr=lr, **kwargs))
    if others or not parts:
        parts.append(torch.optim.AdamW(others or params, lr=lr, weight_decay=kwargs.get("weight_decay", 0.0)))
    return parts[0] if len(parts) == 1 else SplitOptimizer(parts)


def _schedule_free_adamw(params: Iterable[torch.nn.Parameter], lr: float = 0.0025, **kwargs: Any) -> torch.optim.Optimizer:
    """The schedulefree package's AdamWScheduleFree (``lr``'s default is its own)."""
    try:
        import schedulefree
    except ImportError:
        raise ImportError(
            "trainer.optimizer.type: schedule_free_adamw needs the schedulefree package: "
            "pip install 'raylight[declarative]' (or pip install schedulefree)"
        ) from None
    return schedulefree.AdamWScheduleFree(params, lr=lr, **kwargs)


# trainer.optimizer.type -> what builds it from (params, lr=..., **OptimizerConfig.kwargs())
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adadelta": torch.optim.Adadelta,
    "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam, "rmsprop": torch.optim.RMSprop,
    "radam": torch.optim.RAdam, "adafactor": torch.optim.Adafactor, "muon": _muon,
    "schedule_free_adamw": _schedule_free_adamw, "lbfgs": torch.optim.LBFGS,
}


def build_optimizer(config: OptimizerConfig, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer ``config`` names over ``params`` at rate ``lr``."""
    return OPTIMIZERS[config.type](params, lr=lr, **config.kwargs())


def takes_closure(config: OptimizerConfig) -> bool:
    """Whether the type's step re-evaluates the loss through a closure (lbfgs)."""
    return config.type in CLOSURE_OPTIMIZERS


def train_mode(optimizer: torch.optim.Optimizer) -> None:
    """Put a schedule-free optimizer's weights at its training point (nothing for others)."""
    switch = getattr(optimizer, "train", None)
    if callable(switch):
        switch()


def eval_mode(optimizer: torch.optim.Optimizer) -> None:
    """Put a schedule-free optimizer's weights at its evaluation point, the average it
    keeps (nothing for others): before an evaluation and before the weights are saved."""
    switch = getattr(optimizer, "eval", None)
    if callable(switch):
        switch()


class SplitOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped as one: ``param_groups`` are
    theirs (a rate set on one is set on the optimizer that steps it), ``state_dict`` holds
    each one's."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts
        params = [p for part in parts for group in part.param_groups for p in group["params"]]
        super().__init__(params, {})
        self.param_groups = [group for part in parts for group in part.param_groups]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        parts = state_dict.get("parts")
        if not isinstance(parts, list) or len(parts) != len(self.parts):
            raise ValueError(
                f"the checkpoint's optimizer state has {len(parts) if isinstance(parts, list) else 'no'} parts, this "
                f"optimizer {len(self.parts)}: it was saved by another trainer.optimizer.type"
            )
        for part, state in zip(self.parts, parts, strict=True):
            part.load_state_dict(state)
        self.param_groups = [group for part in self.parts for group in part.param_groups]

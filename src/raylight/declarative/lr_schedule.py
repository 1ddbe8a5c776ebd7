"""Ludwig's learning-rate schedules (``trainer.learning_rate_scheduler``), as pure functions
of the training clock.

The clock counts optimizer steps at the starting batch size: epoch x steps per epoch, plus
the samples of the current epoch already trained on divided by that batch (rounded up).
With a fixed batch it is the step count Ludwig's scheduler sees, and every value below is
the one Ludwig's torch schedulers give at that step (``LambdaLR`` warm-up, then the decay,
as ``SequentialLR`` chains them; ``CosineAnnealingWarmRestarts``; ``OneCycleLR`` with its
momentum cycle; ``tests/declarative/test_lr_schedule.py`` checks them against torch's), but one:
``polynomial`` after a warm-up decays over the steps after it, as Ludwig documents it
(Ludwig 0.17 subtracts the warm-up twice, so its polynomial decay starts above the base
rate and ends short of ``polynomial_end_lr``). With
``batch_size: auto`` a step at a larger batch advances the clock by as many steps of the
starting batch as it holds samples, so a schedule spans the configured epochs whatever
batches the adaptive engine picks; the engine's LR rule then multiplies the scheduled rate.

``reduce_on_plateau`` is Ludwig's capped ``ReduceLROnPlateau``: after each epoch's
evaluation (raylight evaluates once per epoch: Ludwig's ``steps_per_checkpoint`` is an
epoch), at most ``reduce_on_plateau`` times, it multiplies the scheduled rate by
``reduce_on_plateau_rate`` when the metric has not improved (by torch's relative 1e-4) for
more than ``reduce_on_plateau_patience`` evaluations. ``RateSchedule`` applies them to the
declarative loop's optimizer (its param groups). No Ray and no torch import here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from raylight.declarative.metrics import MINIMIZED, metric_key

if TYPE_CHECKING:
    import torch

    from raylight.declarative.config.model import ModelConfig

__all__ = ["Plateau", "Schedule", "schedule_clock"]

# torch.optim.lr_scheduler.OneCycleLR's momentum cycle (Ludwig keeps torch's defaults).
ONE_CYCLE_BASE_MOMENTUM, ONE_CYCLE_MAX_MOMENTUM = 0.85, 0.95
# torch.optim.lr_scheduler.ReduceLROnPlateau's defaults, which Ludwig keeps.
PLATEAU_THRESHOLD = 1e-4



def schedule_clock(epoch: int, cursor: int, batch_size: int, steps_per_epoch: int) -> int:
    """The clock (in steps at ``batch_size``, the starting batch) after ``cursor`` samples of
    epoch ``epoch`` (0-based): an epoch's end is the next epoch's start."""
    return epoch * steps_per_epoch + min(math.ceil(cursor / batch_size), steps_per_epoch)


def _cosine(start: float, end: float, pct: float) -> float:
    """torch's cosine annealing from ``start`` to ``end`` at ``pct`` (0 to 1) of the way."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


class Schedule:
    """The learning rate (and, for ``one_cycle``, the momentum) at each clock value of a run
    of ``total_steps`` steps of ``steps_per_epoch`` each, from the base rate ``base_lr``.

    ``config`` is the ``learning_rate_scheduler`` section (anything with its attributes).
    """

    def __init__(self, config: Any, *, base_lr: float, total_steps: int, steps_per_epoch: int) -> None:
        self.config = config
        self.base_lr = base_lr
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        warmup = 0.0
        if config.warmup_fraction > 0:
            warmup = max(config.warmup_fraction * total_steps, warmup)
        if config.warmup_evaluations > 0:
            warmup = max(config.warmup_evaluations * steps_per_epoch, warmup)
        # one_cycle and wsd warm up themselves (the config refuses a warm-up beside them).
        self.warmup_steps = 0.0 if config.decay in ("one_cycle", "wsd") else warmup

    def lr(self, clock: float) -> float:
        """The learning rate of the step at ``clock``."""
        w = self.warmup_steps
        if w > 0 and clock < w:
            return self.base_lr * clock / w  # LambdaLR's warm-up: 0 at the first step
        # SequentialLR starts the decay's own count at the first whole step after the warm-up.
        return self._decayed(max(0.0, clock - math.ceil(w)) if w > 0 else clock)

    def momentum(self, clock: float) -> float | None:
        """``one_cycle``'s momentum (SGD's ``momentum``, Adam's first beta) at ``clock``;
        None for the other schedules, which leave it alone."""
        if self.config.decay != "one_cycle":
            return None
        up, down = self._one_cycle_phases()
        lo, hi = ONE_CYCLE_BASE_MOMENTUM, ONE_CYCLE_MAX_MOMENTUM
        if clock <= up:
            return _cosine(hi, lo, self._pct(clock, 0.0, up))
        return _cosine(lo, hi, self._pct(clock, up, down))

    # -- the decays ----------------------------------------------------------------------
    def _decayed(self, step: float) -> float:
        c, lr0, n, w = self.config, self.base_lr, self.total_steps, self.warmup_steps
        if c.decay is None:
            return lr0
        if c.decay == "linear":
            return lr0 * max(0.0, (n - w - step) / max(1.0, n - w))
        if c.decay == "exponential":
            exponent = 1 + step / c.decay_steps
            return lr0 * c.decay_rate ** (math.ceil(exponent) if c.staircase else exponent)
        if c.decay == "cosine":
            return self._cosine_restarts(step)
        if c.decay == "one_cycle":
            return self._one_cycle(step)
        if c.decay == "inverse_sqrt":
            return lr0 / math.sqrt(max(step, float(c.inverse_sqrt_warmup_steps)))
        if c.decay == "polynomial":
            if n <= w:
                return lr0
            progress = min(step / max(1.0, n - w), 1.0)
            end = c.polynomial_end_lr
            return lr0 * ((1.0 - end) * (1.0 - progress) ** c.polynomial_power + end)
        if c.decay == "wsd":
            warm_end = c.wsd_warmup_fraction * n
            stable_end = warm_end + c.wsd_stable_fraction * n
            if step < warm_end:
                return lr0 * step / max(1.0, warm_end)
            if step < stable_end:
                return lr0
            return lr0 * _cosine(1.0, 0.0, min((step - stable_end) / max(1.0, n - stable_end), 1.0))
        raise ValueError(f"unknown decay {c.decay!r}")

    def _cosine_restarts(self, step: float) -> float:
        """``CosineAnnealingWarmRestarts`` (T_0 = t_0, else one epoch's steps)."""
        c = self.config
        t_0 = c.t_0 or self.steps_per_epoch or 1
        t_i, t_cur = float(t_0), step
        if step >= t_0:
            if c.t_mult == 1:
                t_cur = step % t_0
            else:
                k = int(math.log(step / t_0 * (c.t_mult - 1) + 1, c.t_mult))
                t_cur = step - t_0 * (c.t_mult**k - 1) / (c.t_mult - 1)
                t_i = t_0 * c.t_mult**k
        return c.eta_min + (self.base_lr - c.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2

    def _one_cycle_phases(self) -> tuple[float, float]:
        n = max(self.total_steps, 1)
        return float(self.config.pct_start * n) - 1, float(n - 1)

    @staticmethod
    def _pct(step: float, start: float, end: float) -> float:
        return min(max((step - start) / (end - start), 0.0), 1.0) if end != start else 1.0

    def _one_cycle(self, step: float) -> float:
        """``OneCycleLR``, cosine annealing, two phases (Ludwig's)."""
        c = self.config
        peak = c.max_lr if c.max_lr is not None else self.base_lr
        initial = peak / c.div_factor
        final = initial / c.final_div_factor
        up, down = self._one_cycle_phases()
        if step <= up:
            return _cosine(initial, peak, self._pct(step, 0.0, up))
        return _cosine(peak, final, self._pct(step, up, down))


class Plateau:
    """Ludwig's capped ``ReduceLROnPlateau``: ``step(metric)`` after each evaluation; the
    scheduled rate is multiplied by ``factor()``. Its state goes into checkpoints."""

    def __init__(self, *, limit: int, rate: float, patience: int, metric: str) -> None:
        self.limit, self.rate, self.patience = limit, rate, patience
        self.minimize = metric in MINIMIZED
        self.best = math.inf if self.minimize else -math.inf
        self.bad = 0
        self.reductions = 0

    def _better(self, value: float) -> bool:
        if self.minimize:
            return value < self.best * (1.0 - PLATEAU_THRESHOLD)
        return value > self.best * (1.0 + PLATEAU_THRESHOLD)

    def step(self, value: float) -> bool:
        """Hear one evaluation's metric; True when it reduced the rate."""
        if self.reductions >= self.limit:
            return False
        if self._better(value):
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        if self.bad > self.patience:
            self.reductions += 1
            self.bad = 0
            return True
        return False

    def factor(self) -> float:
        return self.rate**self.reductions

    def state_dict(self) -> dict[str, float]:
        return {"best": self.best, "bad": self.bad, "reductions": self.reductions}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.best, self.bad, self.reductions = float(state["best"]), int(state["bad"]), int(state["reductions"])


class RateSchedule:
    """``trainer.learning_rate_scheduler`` applied to the loop's optimizer: each step's rate
    (and one_cycle's momentum) from the loader's position, reductions on plateau after each
    evaluation (raylight.declarative.lr_schedule has the math). Without the section, the
    rate stays ``base_lr``."""

    def __init__(self, cfg: ModelConfig, *, base_lr: float, batch_size: int, train_rows: int) -> None:
        section = cfg.trainer.learning_rate_scheduler
        self.batch_size = batch_size
        self.steps_per_epoch = math.ceil(train_rows / batch_size)
        # trainer.train_steps, Ludwig's budget in steps, else the epochs' steps
        self.budget = cfg.trainer.train_steps
        total = self.budget or cfg.trainer.epochs * self.steps_per_epoch
        self.epochs = math.ceil(total / self.steps_per_epoch)
        self.last = base_lr  # the rate of the last step taken
        self.schedule = self.plateau = None
        self.section = section
        self.outputs, self.field = [out.name for out in cfg.output_features], cfg.trainer.validation_field
        if section is not None:
            self.schedule = Schedule(section, base_lr=base_lr, total_steps=total, steps_per_epoch=self.steps_per_epoch)
            if section.reduce_on_plateau > 0:
                self.plateau = Plateau(
                    limit=section.reduce_on_plateau, rate=section.reduce_on_plateau_rate,
                    patience=section.reduce_on_plateau_patience, metric=section.reduce_eval_metric,
                )

    def clock(self, loader: Any) -> int:
        """Steps (of the first batch) trained so far, from the loader's position."""
        return schedule_clock(loader.epoch, loader.cursor, self.batch_size, self.steps_per_epoch)

    def spent(self, loader: Any) -> bool:
        """Whether ``trainer.train_steps`` steps are done (never without the key)."""
        return self.budget is not None and self.clock(loader) >= self.budget

    def apply(self, opt: torch.optim.Optimizer, loader: Any) -> None:
        """Set the rate of the next step (every group, as Ludwig's scheduler does)."""
        self.last = opt.param_groups[0]["lr"]
        if self.schedule is None:
            return
        clock = self.clock(loader)
        rate = self.schedule.lr(clock) * (self.plateau.factor() if self.plateau is not None else 1.0)
        momentum = self.schedule.momentum(clock)
        for group in opt.param_groups:
            group["lr"] = rate
            if momentum is not None:  # one_cycle: SGD's momentum or Adam's first beta
                if "betas" in group:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum

    def evaluated(self, train_loss: float, validation: dict[str, float]) -> None:
        """Hear an epoch's evaluation (reduction on plateau)."""
        if self.plateau is None or self.section is None:
            return
        split, metric = self.section.reduce_eval_split, self.section.reduce_eval_metric
        self.plateau.step(train_loss if split == "training" else validation[metric_key(self.outputs, self.field, metric)])

    def state_dict(self) -> dict[str, Any] | None:
        return self.plateau.state_dict() if self.plateau is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.plateau is not None and state is not None:
            self.plateau.load_state_dict(state)

"""Ludwig's learning-rate schedules (raylight.declarative.lr_schedule) against torch's
schedulers, chained the way Ludwig 0.17 chains them (ludwig/modules/lr_scheduler.py): a
``LambdaLR`` warm-up, then the decay, in a ``SequentialLR``; ``CosineAnnealingWarmRestarts``;
``OneCycleLR`` alone; the capped ``ReduceLROnPlateau``. Each step's rate (and one_cycle's
momentum) must be the one torch gives that step."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch.optim.lr_scheduler import (
    CosineAnnealingWarmRestarts,
    LambdaLR,
    OneCycleLR,
    ReduceLROnPlateau,
    SequentialLR,
)

from raylight.declarative.config.model import ModelConfig
from raylight.declarative.config.trainer import LRSchedulerConfig
from raylight.declarative.lr_schedule import Plateau, Schedule, schedule_clock

BASE_LR = 0.01


# Ludwig's decay functions of (the decay's own step, total steps, warm-up steps), as its
# module writes them; polynomial as Ludwig documents it (see test_polynomial_after_warm_up).
def _ludwig_lambda(c: LRSchedulerConfig, n: int, w: float):
    if c.decay is None:
        return lambda step: 1.0
    if c.decay == "linear":
        return lambda step: max(0.0, float(n - w - step) / float(max(1, n - w)))
    if c.decay == "exponential":
        return lambda step: c.decay_rate ** (
            math.ceil(1 + step / c.decay_steps) if c.staircase else 1 + step / c.decay_steps
        )
    if c.decay == "inverse_sqrt":
        return lambda step: 1.0 / math.sqrt(max(float(step), float(c.inverse_sqrt_warmup_steps)))
    if c.decay == "polynomial":
        return lambda step: 1.0 if n <= w else (
            (1 - c.polynomial_end_lr) * (1 - min(step / max(1, n - w), 1.0)) ** c.polynomial_power + c.polynomial_end_lr
        )
    if c.decay == "wsd":
        def wsd(step):
            warm = c.wsd_warmup_fraction * n
            stable = warm + c.wsd_stable_fraction * n
            if step < warm:
                return step / max(1.0, warm)
            if step < stable:
                return 1.0
            return 0.5 * (1.0 + math.cos(math.pi * min((step - stable) / max(1.0, n - stable), 1.0)))
        return wsd
    raise AssertionError(c.decay)


def torch_rates(c: LRSchedulerConfig, *, n: int, per_epoch: int, optimizer: str = "sgd"):
    """Each of ``n`` steps' (rate, momentum) from torch's schedulers, built as Ludwig builds them."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = (torch.optim.SGD([param], lr=BASE_LR, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam([param], lr=BASE_LR))
    w = 0.0
    if c.warmup_fraction > 0:
        w = max(c.warmup_fraction * n, w)
    if c.warmup_evaluations > 0:
        w = max(c.warmup_evaluations * per_epoch, w)
    if c.decay == "one_cycle":
        sched = OneCycleLR(opt, max_lr=c.max_lr or BASE_LR, total_steps=n, pct_start=c.pct_start,
                           div_factor=c.div_factor, final_div_factor=c.final_div_factor, anneal_strategy="cos")
    else:
        if c.decay == "cosine":
            decay = CosineAnnealingWarmRestarts(opt, T_0=c.t_0 or per_epoch, T_mult=c.t_mult, eta_min=c.eta_min)
        else:
            decay = LambdaLR(opt, _ludwig_lambda(c, n, w))
        if w > 0 and c.decay != "wsd":
            warm = LambdaLR(opt, lambda step: float(step) / float(max(1, w)))
            sched = SequentialLR(opt, schedulers=[warm, decay], milestones=[w])
        else:
            sched = decay
    out = []
    for _ in range(n):
        group = opt.param_groups[0]
        out.append((group["lr"], group["betas"][0] if "betas" in group else group["momentum"]))
        opt.step()
        sched.step()
    return out


CASES = [
    {},
    {"decay": "linear"},
    {"decay": "linear", "warmup_evaluations": 1},
    {"decay": "linear", "warmup_fraction": 0.13},  # a warm-up of a fractional number of steps
    {"decay": "exponential", "decay_steps": 7, "decay_rate": 0.5},
    {"decay": "exponential", "decay_steps": 7, "decay_rate": 0.5, "staircase": True, "warmup_evaluations": 2},
    {"decay": "cosine"},
    {"decay": "cosine", "t_0": 5, "eta_min": 0.001, "warmup_fraction": 0.1},
    {"decay": "cosine", "t_0": 3, "t_mult": 2},
    {"decay": "one_cycle"},
    {"decay": "one_cycle", "max_lr": 0.1, "pct_start": 0.25, "div_factor": 10, "final_div_factor": 100},
    {"decay": "inverse_sqrt", "inverse_sqrt_warmup_steps": 4},
    {"decay": "inverse_sqrt", "inverse_sqrt_warmup_steps": 4, "warmup_evaluations": 1},
    {"decay": "polynomial", "polynomial_power": 2.0, "polynomial_end_lr": 0.1},
    {"decay": "wsd", "wsd_warmup_fraction": 0.2, "wsd_stable_fraction": 0.5, "wsd_decay_fraction": 0.3},
    {"warmup_evaluations": 1.5},
]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("case", CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "none" for c in CASES])
def test_each_step_s_rate_is_torch_s_as_ludwig_chains_them(case, optimizer):
    config = LRSchedulerConfig.model_validate(case)
    per_epoch, epochs = 9, 5
    n = per_epoch * epochs
    schedule = Schedule(config, base_lr=BASE_LR, total_steps=n, steps_per_epoch=per_epoch)
    expected = torch_rates(config, n=n, per_epoch=per_epoch, optimizer=optimizer)
    for step, (lr, momentum) in enumerate(expected):
        assert schedule.lr(step) == pytest.approx(lr, rel=1e-9, abs=1e-15), step
        if config.decay == "one_cycle":
            assert schedule.momentum(step) == pytest.approx(momentum, rel=1e-9), step
        else:
            assert schedule.momentum(step) is None


def test_polynomial_after_warm_up_decays_over_the_steps_after_it():
    """Ludwig 0.17 subtracts the warm-up twice in its polynomial decay; raylight's starts at
    the base rate when the warm-up ends and reaches polynomial_end_lr at the last step."""
    config = LRSchedulerConfig(decay="polynomial", warmup_fraction=0.2, polynomial_end_lr=0.1)
    schedule = Schedule(config, base_lr=BASE_LR, total_steps=50, steps_per_epoch=10)
    assert schedule.lr(10) == pytest.approx(BASE_LR)
    assert schedule.lr(50) == pytest.approx(0.1 * BASE_LR)
    rates = [schedule.lr(s) for s in range(50)]
    assert max(rates) <= BASE_LR * (1 + 1e-12)


def test_the_clock_counts_steps_at_the_first_batch_and_an_epoch_s_end_is_the_next_s_start():
    # 100 samples at batch 32: 4 steps an epoch, the last of 4 samples
    assert [schedule_clock(0, c, 32, 4) for c in (0, 32, 64, 96, 100)] == [0, 1, 2, 3, 4]
    assert schedule_clock(1, 0, 32, 4) == 4
    # a step of a larger (adaptive) batch moves it by the steps of the first batch it holds
    assert schedule_clock(0, 96, 32, 4) - schedule_clock(0, 0, 32, 4) == 3


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_plateau_reduces_as_torch_s_and_stops_at_its_limit(metric):
    """Against torch's ReduceLROnPlateau (Ludwig's class caps its reductions): the same
    epochs reduce, and no more than ``limit`` of them."""
    values = [1.0, 0.9, 0.9, 0.9, 0.95, 0.899, 0.8999, 0.9, 0.91, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    if metric == "accuracy":
        values = [1 - v for v in values]
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    ref = ReduceLROnPlateau(opt, mode="min" if metric == "loss" else "max", factor=0.5, patience=2)
    ours = Plateau(limit=3, rate=0.5, patience=2, metric=metric)
    seen = 0
    for value in values:
        before = opt.param_groups[0]["lr"]
        if seen < 3:
            ref.step(value)
        reduced = ours.step(value)
        assert reduced == (opt.param_groups[0]["lr"] < before)
        seen += reduced
        assert ours.factor() == pytest.approx(opt.param_groups[0]["lr"])
    assert ours.reductions == 3
    restored = Plateau(limit=3, rate=0.5, patience=2, metric=metric)
    restored.load_state_dict(ours.state_dict())
    assert restored.state_dict() == ours.state_dict()


def _config(section: dict, output: str = "binary", split=(0.7, 0.1, 0.2)) -> ModelConfig:
    return ModelConfig.model_validate({
        "input_features": [{"name": "x", "type": "number"}],
        "output_features": [{"name": "y", "type": output}],
        "trainer": {"learning_rate_scheduler": section},
        "preprocessing": {"split": {"type": "random", "probabilities": list(split)}},
    })


def test_config_takes_ludwig_s_section_and_names_what_is_wrong():
    assert _config({"decay": "cosine", "warmup_fraction": 0.1}).trainer.learning_rate_scheduler.decay == "cosine"
    assert _config(None).trainer.learning_rate_scheduler is None
    # Ludwig's metric names
    section = {"reduce_on_plateau": 2, "reduce_eval_metric": "mean_squared_error", "reduce_eval_split": "validation"}
    assert _config(section, output="number").trainer.learning_rate_scheduler.reduce_eval_metric == "mse"
    bad = [
        ({"decay": "step"}, "decay", "'linear'"),
        ({"decay": "one_cycle", "warmup_fraction": 0.1}, "warms up itself (pct_start)", None),
        ({"decay": "wsd", "warmup_evaluations": 1}, "warms up itself (wsd_warmup_fraction)", None),
        ({"wsd_warmup_fraction": 0.5, "wsd_stable_fraction": 0.6}, "sum to at most 1", None),
        ({"reduce_eval_split": "test"}, "evaluates the test split once", None),
        ({"reduce_on_plateau": 1, "reduce_eval_metric": "accuracy"}, "not measured on the training split", "['loss']"),
        ({"reduce_on_plateau": 1, "reduce_eval_metric": "r2", "reduce_eval_split": "validation"}, "of a binary output", "'accuracy'"),
        ({"warmup_fraction": 1.5}, "warmup_fraction", None),
        ({"decay_steps": 0}, "decay_steps", None),
        ({"typo_key": 1}, "typo_key", None),
    ]
    for section, words, more in bad:
        with pytest.raises(ValidationError) as err:
            _config(section)
        text = str(err.value)
        assert "learning_rate_scheduler" in text and words in text, (section, text)
        if more:
            assert more in text
    with pytest.raises(ValidationError, match="gives it 0"):
        _config({"reduce_on_plateau": 1, "reduce_eval_split": "validation"}, split=(0.8, 0.0, 0.2))


def test_the_loop_s_rates_follow_the_loader_and_reduce_on_plateau_from_its_checkpoint():
    """``RateSchedule`` (the declarative loop's): each step's rate from the loader's
    position, one_cycle's Adam beta, reductions after evaluations, its state restored."""
    from types import SimpleNamespace

    from raylight.declarative.lr_schedule import RateSchedule

    def schedule(section):
        return RateSchedule(_config(section), base_lr=BASE_LR, batch_size=32, train_rows=100)  # 4 steps an epoch

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param], lr=BASE_LR)
    loader = SimpleNamespace(epoch=0, cursor=0)
    rates = schedule({"decay": "linear", "reduce_on_plateau": 2, "reduce_on_plateau_patience": 0, "reduce_on_plateau_rate": 0.5})
    total = 10 * 4  # trainer.epochs' default: 10
    for cursor, step in ((0, 0), (64, 2), (100, 4)):
        loader.cursor = cursor
        rates.apply(opt, loader)
        assert opt.param_groups[0]["lr"] == pytest.approx(BASE_LR * (total - step) / total)
    rates.evaluated(train_loss=1.0, validation={})
    rates.evaluated(train_loss=1.0, validation={})  # no better: halved
    rates.apply(opt, loader)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * BASE_LR * (total - 4) / total)
    assert rates.last == pytest.approx(BASE_LR * (total - 4) / total)  # the rate the last step had
    again = schedule({"decay": "linear", "reduce_on_plateau": 2, "reduce_on_plateau_patience": 0, "reduce_on_plateau_rate": 0.5})
    again.load_state_dict(rates.state_dict())
    again.apply(opt, loader)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * BASE_LR * (total - 4) / total)
    cycle = schedule({"decay": "one_cycle"})
    loader.cursor = 0
    cycle.apply(opt, loader)
    assert opt.param_groups[0]["betas"] == (pytest.approx(0.95), 0.999)
    assert opt.param_groups[0]["lr"] == pytest.approx(BASE_LR / 25)
    plain = schedule(None)
    opt.param_groups[0]["lr"] = 0.123
    plain.apply(opt, loader)
    assert opt.param_groups[0]["lr"] == 0.123 and plain.state_dict() is None

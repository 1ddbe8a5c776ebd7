"""GoodputScalingPolicy on its own: timers, the one (min, max) clamp, sizes, threads,
autoscaler requests, and the decisions it returns (no controller, no Ray)."""

from __future__ import annotations

import pytest

from raylight.adaptive.engine import AdaptiveEngine
from raylight.adaptive.goodput import PerfParams, predict_step_time
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.profile import StepProfile
from raylight.config.schema import AdaptiveConfig, ScalingConfig, TrainerConfig
from raylight.driver.controller import (
    FixedScalingPolicy,
    GoodputScalingPolicy,
    RequestResources,
    Resize,
    ScalingSettings,
    ScalingView,
    SetPlan,
)
from raylight.driver.trainer import build_scaling_policy, engine_settings
from raylight.worker.protocol import GroupPoll, WorkerPoll


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settings(**kw) -> ScalingSettings:
    base = dict(
        elastic=True, min_workers=1, max_workers=4, threads_per_worker=1, thread_budget=None,
        decision_interval_s=1.0, resize_interval_s=1.0, autoscale=False, resize_in_place=True,
    )
    base.update(kw)
    return ScalingSettings(**base)


def policy(*, scaling_policy="goodput", trace=None, clock=None, **kw) -> GoodputScalingPolicy:
    eng = AdaptiveEngine(engine_settings(
        ScalingConfig(num_workers=(1, 4), scaling_policy=scaling_policy),
        AdaptiveConfig(max_batch_size=256, local_batch_bounds=(4, 64), min_profile_steps=3),
    ))
    return GoodputScalingPolicy(eng, settings(**kw), trace=trace, clock=clock or Clock())


def measured_poll() -> GroupPoll:
    """Rank 0 reports two measured batch sizes of a 2-worker layout and a noisy gradient."""
    perf = PerfParams(0.01, 1e-4, 0.05, 0.01, 0.02, 0.005, 1.0)
    prof = StepProfile()
    for m in (8, 16):
        for _ in range(5):
            prof.add((1, 2, m, 1), optim_time=float(predict_step_time(perf, 1, 2, m, 0)))
    stats = AdaptiveStats(prof.to_json(), BatchPlan(8), 16, 1.0, 50.0, 1.0, 0.0, 1)
    return GroupPoll([WorkerPoll(0, "running", adaptive=stats), WorkerPoll(1, "running")])


def view(now: float, poll: GroupPoll, *, workers=2, capacity=2) -> ScalingView:
    return ScalingView(now, workers, 1, poll, lambda: capacity)


def test_the_one_clamp_bounds_every_size():
    p = policy(min_workers=2, max_workers=4)
    assert p.start_size(lambda: 16) == 4 and p.start_size(lambda: 0) == 2
    assert p.restart_size(9) == 4 and p.fewest(3) == 2
    assert p.on_lost(4, lost=3) == Resize(2, "lost 3 worker(s)", True)
    fixed = policy(elastic=False, min_workers=3, max_workers=3)
    assert fixed.start_size(lambda: 16) == 3 and fixed.fewest(3) == 3 and fixed.on_lost(3, 1) is None


def test_a_notice_shrinks_an_elastic_run_in_place_and_restarts_a_fixed_one():
    p = policy(min_workers=1, max_workers=4)
    shrink = p.on_notice(3, frozenset({1, 2}))
    assert shrink is not None and shrink.num_workers == 1 and shrink.in_place and shrink.snapshot
    assert shrink.leaving == frozenset({1, 2})
    everyone = p.on_notice(2, frozenset({0, 1}))  # no survivor: snapshot, then a restart
    assert everyone is not None and everyone.leaving == frozenset({0, 1}) and everyone.snapshot
    fixed = policy(elastic=False, min_workers=3, max_workers=3).on_notice(3, frozenset({2}))
    assert fixed is not None and fixed.num_workers == 3 and fixed.leaving == frozenset({0, 1, 2})


def test_threads_share_the_largest_sizes_cpus():
    p = policy(thread_budget=4.0)
    assert [p.threads(k) for k in (1, 2, 3, 4)] == [4, 2, 1, 1]
    assert policy(threads_per_worker=3).threads(2) == 3


def test_decisions_wait_for_their_intervals_and_trace_what_was_considered():
    clock, rows = Clock(), []
    p = policy(scaling_policy="max", autoscale=True, trace=rows.append, clock=clock)
    poll = measured_poll()
    p.observe(poll)
    assert p.decide(view(0.5, poll)) == [] and rows == []  # neither interval has passed
    decisions = p.decide(view(5.0, poll, capacity=2))
    plan = next(d for d in decisions if isinstance(d, SetPlan))
    assert plan.plan.version == 1 and plan.plan.global_batch(2) > 16 and "predicted goodput" in plan.reason
    asked = [d for d in decisions if isinstance(d, RequestResources)]
    assert [d.num_workers for d in asked] == [4], "more workers would help than fit: ask the autoscaler"
    assert "2 fit now" in asked[0].reason
    assert not any(isinstance(d, Resize) for d in decisions), "2 workers is all that fits"
    assert rows[-1]["decision"] == "batch" and rows[-1]["workers"] == 2
    # the row is the interval that ran (batch 16); the batch it chose runs from here on
    assert rows[-1]["global_batch"] == 16 and rows[-1]["decided_batch"] == plan.plan.global_batch(2)
    assert p.decide(view(5.5, poll)) == [], "the timers restarted"


def test_a_resize_never_leaves_min_and_max():
    p = policy(scaling_policy="max", max_workers=4)
    poll = measured_poll()
    p.observe(poll)
    resize = next(d for d in p.decide(view(5.0, poll, capacity=16)) if isinstance(d, Resize))
    assert resize.num_workers == 4 and resize.in_place


def test_a_new_size_runs_a_whole_interval_from_its_first_step_before_the_next_look():
    """A resize slower than resize_interval_s (a DeepSpeed restart) is not undone the
    moment its first step lands: the interval counts again from that step."""
    clock = Clock()
    p = policy(scaling_policy="max", max_workers=4, resize_interval_s=10.0, clock=clock)
    poll = measured_poll()
    p.observe(poll)
    clock.now = 25.0  # the first step at the new size, 25 s after the last look
    p.record_restart(20.0)
    assert not any(isinstance(d, Resize) for d in p.decide(view(34.0, poll, capacity=4)))
    grow = [d for d in p.decide(view(35.0, poll, capacity=4)) if isinstance(d, Resize)]
    assert [d.num_workers for d in grow] == [4]


def test_a_new_size_gets_the_plan_for_its_size():
    p = policy()
    p.observe(measured_poll())
    p.started(2)
    plan = p.plan(4)
    assert plan is not None and plan.version == 1 and plan.global_batch(4) >= 16


def test_build_scaling_policy_from_config():
    fixed = build_scaling_policy(TrainerConfig(scaling=ScalingConfig(num_workers=3)))
    assert isinstance(fixed, FixedScalingPolicy) and fixed.start_size(lambda: 1) == 3
    elastic = build_scaling_policy(TrainerConfig(scaling=ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 2})))
    assert isinstance(elastic, GoodputScalingPolicy)
    assert elastic.settings.thread_budget == 8.0 and elastic.threads(2) == 4
    assert elastic.settings.decision_interval_s == AdaptiveConfig().decision_interval_s


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_fixed_size_adaptive_run_keeps_its_size(adaptive):
    cfg = TrainerConfig(scaling=ScalingConfig(num_workers=2), adaptive=AdaptiveConfig() if adaptive else None)
    p = build_scaling_policy(cfg)
    assert p.start_size(lambda: 8) == 2 and p.restart_size(2) == 2 and p.on_lost(2, 1) is None

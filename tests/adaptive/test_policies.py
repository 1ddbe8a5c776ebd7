"""Adaptive policies with no Ray: given fitted models and resources, the expected decision."""

import math

import numpy as np
import pytest

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams
from raylight.adaptive.lr import lr_factor, progress_increment
from raylight.adaptive.policy import BatchSizePolicy, ElasticPolicy, Layout

CHEAP_SYNC = PerfParams(0.01, 1e-3, 0.002, 0.0, 0.002, 0.0, 1.0)  # scales almost linearly
COSTLY_SYNC = PerfParams(0.01, 1e-3, 0.5, 0.1, 0.5, 0.1, 1.0)  # sync dominates
GROWING_SYNC = PerfParams(0.01, 1e-3, 0.05, 0.3, 0.05, 0.3, 1.0)  # sync grows with replicas


def batch_policy(**kw):
    args = dict(init_batch_size=64, max_batch_size=4096, local_bsz_bounds=(16, 512), accumulation=True)
    args.update(kw)
    return BatchSizePolicy(**args)


def test_batch_grows_when_gradients_are_noisy_and_holds_when_not():
    noisy = GoodputFunction(COSTLY_SYNC, GradParams(sqr=1.0, var=50.0), 64)
    decision = batch_policy().decide(noisy, num_nodes=1, num_replicas=2, atomic_bsz=32, accum_steps=0)
    assert decision is not None and 2 * decision.atomic_bsz * (decision.accum_steps + 1) > 64
    assert decision.predicted_goodput > decision.current_goodput * 1.05
    assert 16 <= decision.atomic_bsz <= 512
    quiet = GoodputFunction(CHEAP_SYNC, GradParams(sqr=1.0, var=1e-4), 64)
    assert batch_policy().decide(quiet, num_nodes=1, num_replicas=2, atomic_bsz=32, accum_steps=0) is None


def test_batch_policy_does_not_thrash():
    fn = GoodputFunction(COSTLY_SYNC, GradParams(sqr=1.0, var=50.0), 64)
    first = batch_policy().decide(fn, num_nodes=1, num_replicas=2, atomic_bsz=32, accum_steps=0)
    again = batch_policy().decide(fn, num_nodes=1, num_replicas=2, atomic_bsz=first.atomic_bsz, accum_steps=first.accum_steps)
    assert again is None
    # A tiny improvement stays below the threshold.
    huge = batch_policy(threshold=10.0).decide(fn, num_nodes=1, num_replicas=2, atomic_bsz=32, accum_steps=0)
    assert huge is None


NOISY = GradParams(1.0, 20.0)


def predictor(perf_by_threads, grad=NOISY, m0=64):
    policy = batch_policy()

    def predict(layout):
        perf = perf_by_threads.get(layout.threads)
        if perf is None:
            return None
        return policy.best(GoodputFunction(perf, grad, m0), num_nodes=1, num_replicas=layout.num_workers)[0]

    return predict


def candidates(max_k, threads_for=lambda k: 1):
    return [Layout(k, threads_for(k)) for k in range(1, max_k + 1)]


def elastic(**kw):
    args = dict(utility_threshold=0.5, hysteresis=0.1, horizon_s=600)
    args.update(kw)
    return ElasticPolicy(**args)


def test_grows_when_scaling_is_cheap():
    d = elastic().decide(current=Layout(2, 1), candidates=candidates(8), predict=predictor({1: CHEAP_SYNC}), explored={1}, restart_cost_s=1.0)
    assert d is not None and d.layout.num_workers > 2 and not d.explore


def test_holds_at_the_best_layout():
    policy = elastic()
    predict = predictor({1: CHEAP_SYNC})
    best = policy.decide(current=Layout(2, 1), candidates=candidates(8), predict=predict, explored={1}, restart_cost_s=1.0).layout
    assert policy.decide(current=best, candidates=candidates(8), predict=predict, explored={1}, restart_cost_s=1.0) is None


def test_shrinks_when_sync_dominates():
    d = elastic().decide(current=Layout(4, 1), candidates=candidates(8), predict=predictor({1: COSTLY_SYNC}), explored={1}, restart_cost_s=1.0)
    assert d is not None and d.layout.num_workers < 4


def test_chooses_only_among_the_candidates():
    """The caller bounds the candidates (the run's (min, max) and what fits)."""
    within = [Layout(k, 1) for k in (3, 4, 5)]
    d = elastic(hysteresis=0.0).decide(
        current=Layout(5, 1), candidates=within, predict=predictor({1: GROWING_SYNC}), explored={1}, restart_cost_s=0
    )
    assert d is not None and d.layout.num_workers == 3, "shrinks as far as the candidates allow"
    d = elastic().decide(
        current=Layout(2, 1), candidates=candidates(5), predict=predictor({1: CHEAP_SYNC}), explored={1}, restart_cost_s=0
    )
    assert d is not None and d.layout.num_workers <= 5
    d = elastic().decide(
        current=Layout(6, 1), candidates=candidates(4), predict=predictor({1: CHEAP_SYNC}), explored={1}, restart_cost_s=0
    )
    assert d is not None and d.layout.num_workers == 4, "the current layout no longer fits: the largest that does"


def test_never_resizes_for_a_gain_smaller_than_the_restart_cost():
    d = elastic(horizon_s=10).decide(
        current=Layout(2, 1), candidates=candidates(8), predict=predictor({1: CHEAP_SYNC}), explored={1}, restart_cost_s=60.0
    )
    assert d is None


def test_falls_back_when_the_cluster_shrinks():
    d = elastic().decide(current=Layout(4, 1), candidates=candidates(2), predict=predictor({1: CHEAP_SYNC}), explored={1}, restart_cost_s=0)
    assert d is not None and d.layout == Layout(2, 1)


def test_two_cores_fewer_workers_with_more_threads_is_discovered():
    """On 2 cores one worker with 2 threads beat 2 single-thread workers: measured models
    for both thread counts must lead the policy to 1 x 2."""
    cands = [Layout(1, 2), Layout(2, 1)]
    two_threads = PerfParams(0.004, 2.5e-4, 0.0, 0.0, 0.0, 0.0, 1.0)  # 1.7x faster compute
    one_thread = PerfParams(0.007, 4.3e-4, 0.02, 0.0, 0.02, 0.0, 1.0)
    policy = elastic()
    # Only 1-thread data so far: explore 2 threads once.
    d = policy.decide(current=Layout(2, 1), candidates=cands, predict=predictor({1: one_thread}), explored={1}, restart_cost_s=1.0)
    assert d is not None and d.explore and d.layout == Layout(1, 2)
    # Both measured: settle on 1 x 2 and stay.
    both = predictor({1: one_thread, 2: two_threads})
    d = policy.decide(current=Layout(2, 1), candidates=cands, predict=both, explored={1, 2}, restart_cost_s=1.0)
    assert d is not None and d.layout == Layout(1, 2)
    assert policy.decide(current=Layout(1, 2), candidates=cands, predict=both, explored={1, 2}, restart_cost_s=1.0) is None


def test_unmeasured_current_layout_waits():
    assert elastic().decide(current=Layout(2, 1), candidates=candidates(4), predict=lambda c: None, explored=set(), restart_cost_s=0) is None


@pytest.mark.parametrize("rule", ["adascale", "sqrt", "linear", "legw", "none"])
def test_lr_rules_are_one_at_the_initial_batch(rule):
    assert lr_factor(rule, 1.0, 1.0, progress=1e9, warmup_steps=10) == pytest.approx(1.0)


def test_lr_rules_values():
    assert lr_factor("sqrt", 4.0, 2.0) == pytest.approx(2.0)
    assert lr_factor("linear", 4.0, 2.0) == pytest.approx(4.0)
    assert lr_factor("adascale", 4.0, 2.5) == pytest.approx(2.5)
    assert lr_factor("none", 4.0, 2.5) == pytest.approx(1.0)
    assert lr_factor("legw", 4.0, 2.0, progress=0, warmup_steps=10) == pytest.approx(4.0 / 40)
    assert lr_factor("legw", 4.0, 2.0, progress=100, warmup_steps=10) == pytest.approx(4.0)
    assert progress_increment("adascale", 4.0, 2.5) == 2.5 and progress_increment("sqrt", 4.0, 2.5) == 4.0
    with pytest.raises(ValueError, match="lr_rule"):
        lr_factor("cubic", 1.0, 1.0)  # type: ignore[arg-type]


def test_engine_refits_the_throughput_model_only_when_the_profile_grew_and_the_fit_misses(monkeypatch):
    """The driver fits afresh when the layouts change; when a layout's step count grew by
    REFIT_GROWTH it refines the fit only if it misses a layout's mean by more than
    REFIT_TOLERANCE: not on every poll (each fit costs tens of ms of the driver's CPU)."""
    import raylight.adaptive.engine as engine_mod
    from raylight.adaptive.engine import REFIT_GROWTH, REFIT_TOLERANCE, AdaptiveEngine
    from raylight.adaptive.profile import StepProfile
    from raylight.config.schema import AdaptiveConfig, ScalingConfig
    from raylight.driver.trainer import engine_settings

    fits = []
    real_fit = engine_mod.fit_perf_params
    monkeypatch.setattr(
        engine_mod,
        "fit_perf_params",
        lambda start=None, **obs: fits.append((obs, start)) or real_fit(**obs, start=start),
    )
    eng = AdaptiveEngine(engine_settings(ScalingConfig(num_workers=2), AdaptiveConfig(min_profile_steps=5)))

    def steps(layout, n, slower=1.0):
        prof = StepProfile()
        for _ in range(n):
            prof.add(layout, optim_time=slower * (0.01 + 1e-4 * layout[2]))
        eng.state.profile.merge(prof)

    assert eng.perf_params(1) is None  # nothing measured
    steps((1, 2, 16, 1), 100)
    first = eng.perf_params(1)
    assert len(fits) == 1
    steps((1, 2, 16, 1), int(100 * (REFIT_GROWTH - 1)))  # grown by the factor, same times
    assert eng.perf_params(1) is first and len(fits) == 1, "the fit still predicts the mean"
    # Steps now slower: once the count grows by the factor again, the mean has moved by
    # more than the tolerance and the fit is refined from the last one.
    slower = 1.0 + 10 * REFIT_TOLERANCE
    steps((1, 2, 16, 1), math.ceil(125 * (REFIT_GROWTH - 1)) - 1, slower=slower)
    assert eng.perf_params(1) is first and len(fits) == 1, "not grown enough to check"
    steps((1, 2, 16, 1), 1, slower=slower)
    refined = eng.perf_params(1)
    assert refined is not first and len(fits) == 2 and fits[-1][1] is first
    steps((1, 2, 64, 1), 5)  # a new layout: a fresh fit
    eng.perf_params(1)
    assert len(fits) == 3 and len(fits[-1][0]["num_nodes"]) == 2 and fits[-1][1] is None
    steps((1, 2, 128, 2), 50)  # another thread count: its own model
    eng.perf_params(1)
    assert len(fits) == 3


def test_fit_error_is_the_largest_relative_miss():
    from raylight.adaptive.perf_model import fit_error

    perf = PerfParams(0.01, 1e-3, 0.0, 0.0, 0.0, 0.0, 1.0)  # one replica: grad time only
    exact = [0.01 + 1e-3 * 16, 0.01 + 1e-3 * 32]
    assert fit_error(perf, [1, 1], [1, 1], [16, 32], [np.nan, exact[1]], exact) == pytest.approx(0.0, abs=1e-12)
    slow = fit_error(perf, [1, 1], [1, 1], [16, 32], [np.nan, np.nan], [exact[0], 1.1 * exact[1]])
    assert slow == pytest.approx(1 - 1 / 1.1)
    assert fit_error(perf, [1], [1], [16], [0.5 * exact[0]], [exact[0]]) == pytest.approx(1.0), "accumulation steps count"


def test_profile_recent_means_forget_at_the_memory_rate_and_totals_do_not():
    from raylight.adaptive.profile import StepProfile

    memory = 100.0
    per_step, by_increment = StepProfile(memory_steps=memory), StepProfile(memory_steps=memory)
    layout, other = (1, 2, 16, 1), (1, 2, 64, 1)
    for prof in (per_step, by_increment):
        prof.add(other, optim_time=0.05)
    for t, n in ((0.01, 300), (0.02, 200)):
        inc = StepProfile()  # a worker's increment: plain sums
        for _ in range(n):
            per_step.add(layout, optim_time=t, accum_time=t / 2)
            inc.add(layout, optim_time=t, accum_time=t / 2)
        by_increment.merge(inc)
    # 200 steps at 20 ms after 300 at 10 ms: the old steps weigh exp(-200/memory) as much
    old = sum(math.exp(-(200 + i) / memory) for i in range(300))
    new = sum(math.exp(-i / memory) for i in range(200))
    want = (0.01 * old + 0.02 * new) / (old + new)
    obs = per_step.observations()
    assert obs.optim_step_time[0] == pytest.approx(want, rel=1e-9)
    assert obs.accum_step_time[0] == pytest.approx(want / 2, rel=1e-2)  # micro-steps decay with their step
    assert obs.weights[0] == pytest.approx(old + new)
    stats = per_step.layouts[layout]
    assert stats.optim_count == 500 and stats.optim_time / stats.optim_count == pytest.approx(0.014)
    # A layout that stopped running keeps its weight: nothing newer says it changed.
    assert obs.optim_step_time[1] == 0.05 and obs.weights[1] == 1.0
    # Increments decay at their end (a poll's steps weigh alike): near the per-step means.
    assert by_increment.observations().optim_step_time[0] == pytest.approx(want, rel=0.05)
    # The state file keeps both; a worker's increment (totals only) loads as equal sums.
    back = StepProfile.from_json(per_step.to_json(), memory_steps=memory)
    assert back.layouts == per_step.layouts
    assert [len(row) for row in per_step.to_json()] == [8, 12]  # the idle layout: totals only
    assert StepProfile.from_json(StepProfile.to_json(inc)).observations().weights[0] == 200
    # Without a memory, recent means are the totals' means.
    flat = StepProfile()
    flat.merge(inc)
    flat.merge(inc)
    assert flat.observations().optim_step_time[0] == pytest.approx(0.02)


def test_a_stall_does_not_become_a_layouts_recent_mean_but_a_lasting_slowdown_does():
    from raylight.adaptive.profile import STALL_FACTOR, StepProfile

    layout = (1, 2, 64, 1)

    def poll(prof, step_s, n=50):
        inc = StepProfile()
        for _ in range(n):
            inc.add(layout, optim_time=step_s, accum_time=step_s / 4)
        prof.merge(inc)
        return prof.observations().optim_step_time[0] + prof.observations().accum_step_time[0] / 4

    def per_step(prof):
        return prof.layouts[layout].recent_step_time

    clipped, plain = StepProfile(memory_steps=500.0), StepProfile()
    for prof in (clipped, plain):
        for _ in range(20):
            poll(prof, 0.003)
    before = per_step(clipped)
    for _ in range(2):  # 100 steps 30x slower: a few seconds of a stalled machine
        poll(clipped, 0.09)
        poll(plain, 0.09)
    after = per_step(clipped)
    # Each stalled poll counted as STALL_FACTOR x the recent mean, not 30x.
    w = math.exp(-50 / 500.0)
    bound = before
    for _ in range(2):
        bound = w * bound + (1 - w) * STALL_FACTOR * bound
    assert after == pytest.approx(bound, rel=0.05) and after < 1.5 * before
    stats = clipped.layouts[layout]
    assert stats.optim_time == pytest.approx(1000 * 0.003 + 100 * 0.09), "totals keep what was measured"
    assert per_step(plain) > 3 * before, "without a memory nothing is clipped (AdaptDL's averages)"
    # Steps at the old speed again: the recent mean is back within 5% after 15 polls (the
    # memory's pace; unclipped, the stall would have left it 2x too slow by then).
    for _ in range(15):
        poll(clipped, 0.003)
    assert per_step(clipped) == pytest.approx(0.003 * 1.25, rel=0.05)
    # A lasting 5x slowdown is followed all the same (the reference doubles with each poll),
    # at the memory's pace once it is past the clip: 2,000 steps, 4 memories.
    for _ in range(40):
        poll(clipped, 0.015)
    assert per_step(clipped) == pytest.approx(0.015 * 1.25, rel=0.05)


def test_the_schema_states_the_stall_factor_the_profile_uses():
    """raylight.config imports nothing of raylight's, so profile_memory_steps' description
    states STALL_FACTOR in words; this keeps the two together."""
    from raylight.adaptive.profile import STALL_FACTOR
    from raylight.config.schema import AdaptiveConfig

    description = AdaptiveConfig.model_fields["profile_memory_steps"].description or ""
    assert f" {STALL_FACTOR:g}x " in description, description


@pytest.mark.parametrize("memory", [None, 200.0])
def test_engine_prediction_follows_a_machine_that_slows_down(memory):
    """Each step of one layout takes 2x longer from some point on: with a memory the
    predicted step time moves to the new speed; without, it stays near the run's mean."""
    from raylight.adaptive.engine import AdaptiveEngine
    from raylight.adaptive.goodput import predict_step_time
    from raylight.adaptive.profile import StepProfile
    from raylight.config.schema import AdaptiveConfig, ScalingConfig
    from raylight.driver.trainer import engine_settings

    eng = AdaptiveEngine(
        engine_settings(ScalingConfig(num_workers=2), AdaptiveConfig(profile_memory_steps=memory))
    )

    def run(layout, n, scale):
        for _ in range(n // 50):  # the increments one poll brings
            inc = StepProfile()
            for _ in range(50):
                inc.add(layout, optim_time=scale * (0.002 + 1e-5 * layout[2]))
            eng.state.profile.merge(inc)
            eng.perf_params(1)  # the driver checks the fit as steps arrive

    run((1, 2, 32, 1), 500, 1.0)
    run((1, 2, 128, 1), 2000, 1.0)
    run((1, 2, 128, 1), 1000, 2.0)  # the machine slows down
    now = 2 * (0.002 + 1e-5 * 128)
    predicted = float(predict_step_time(eng.perf_params(1), 1, 2, 128, 0))
    if memory is None:
        assert predicted < 0.8 * now  # averaged with 2000 fast steps
    else:
        assert predicted == pytest.approx(now, rel=0.05)

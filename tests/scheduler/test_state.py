"""The scheduler's bookkeeping with fake nodes and a fake clock (no Ray)."""

import pytest

from raylight.adaptive.sharing import JobModel
from raylight.scheduler.state import STALE_AFTER_S, SchedulerState

NODES = {"node-a": {"CPU": 2.0}, "node-b": {"CPU": 2.0}}
# A model that scales well: compute-bound, cheap sync, noisy gradients.
MODEL = {
    "perf": [0.01, 0.01, 0.001, 0.0, 0.001, 0.0, 1.0], "grad": [1.0, 100.0], "init_batch_size": 32,
    "max_batch_size": 1024, "atomic_bsz_range": [8, 256], "accumulation": False, "resize_cost_s": 0.5,
}


FOUR = ["node-a", "node-a", "node-b", "node-b"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state(clock=None, **kw) -> SchedulerState:
    return SchedulerState(lambda: NODES, clock=clock or Clock(), **kw)


def test_a_lone_adaptive_job_grows_to_the_cluster_once_it_has_a_model():
    s = state()
    first = s.register("a", min_workers=1, max_workers=4)
    assert first["workers"] == 1 and first["waiting"] == ""  # no model yet: its minimum
    grown = s.report("a", {**MODEL, "nodes": ["node-a"]})
    assert grown["workers"] == 4 and sorted(grown["nodes"]) == ["node-a", "node-a", "node-b", "node-b"]
    assert grown["speedup"] > 1


def test_a_second_job_shrinks_the_first_and_the_first_regrows_when_it_leaves():
    clock = Clock()
    s = state(clock)
    s.register("a", min_workers=1, max_workers=4)
    assert s.report("a", {**MODEL, "nodes": ["node-a"]})["workers"] == 4
    s.report("a", {**MODEL, "nodes": FOUR})  # it grew: held from here for min_hold_s
    clock.now = s.min_hold_s + 1
    s.register("b", min_workers=1, max_workers=4)
    assert s.report("b", {**MODEL, "nodes": []})["workers"] == 0  # a still holds all four
    a = s.report("a", {**MODEL, "nodes": FOUR})
    assert 1 <= a["workers"] < 4  # a shrinks first
    b = s.report("b", {**MODEL, "nodes": []})
    assert b["workers"] == 0 and "held by runs a" in b["waiting"]  # not before a let go
    s.report("a", {**MODEL, "nodes": a["nodes"]})
    b = s.report("b", {**MODEL, "nodes": []})
    assert b["workers"] >= 1 and a["workers"] + b["workers"] <= 4
    s.unregister("b")
    assert s.report("a", {**MODEL, "nodes": a["nodes"]})["workers"] == a["workers"]  # held after its shrink
    clock.now += s.min_hold_s + 1
    assert s.report("a", {**MODEL, "nodes": a["nodes"]})["workers"] == 4


def test_a_fixed_job_that_does_not_fit_waits_and_says_who_holds_the_slots():
    s = state()
    s.register("a", fixed=True, min_workers=3, max_workers=3)
    waiting = s.register("b", fixed=True, min_workers=2, max_workers=2)
    assert waiting["workers"] == 0
    assert waiting["waiting"] == "waiting for 2 CPU slot(s): 1 of 4 free, held by runs a"
    assert [j["waiting"] for j in s.status()["jobs"]] == ["", waiting["waiting"]]


def test_a_silent_job_is_dropped_and_its_slots_freed():
    clock = Clock()
    s = state(clock, stale_after_s=10)
    s.register("a", fixed=True, min_workers=3, max_workers=3)
    assert s.register("b", fixed=True, min_workers=2, max_workers=2)["workers"] == 0
    clock.now = 8
    s.report("b", {})  # b reports, a does not
    clock.now = 11
    assert s.report("b", {})["workers"] == 2
    assert [j["job_id"] for j in s.status()["jobs"]] == ["b"] and s.status()["dropped"] == ["a"]


def test_a_report_from_an_unknown_job_registers_it_as_after_a_restart():
    s = state()
    out = s.report("a", {**MODEL, "nodes": ["node-a", "node-a"]}, min_workers=1, max_workers=2)
    assert out["workers"] == 2 and s.status()["jobs"][0]["max_workers"] == 2


def test_gpu_jobs_count_gpus_and_workers_of_several_cpus_count_whole_workers():
    s = SchedulerState(lambda: {"n": {"CPU": 8.0, "GPU": 2.0}}, clock=Clock())
    assert s.register("g", fixed=True, min_workers=3, max_workers=3, resources={"GPU": 1.0})["workers"] == 0
    s2 = SchedulerState(lambda: {"n": {"CPU": 5.0}}, clock=Clock())
    assert s2.register("c", fixed=True, min_workers=2, max_workers=2, resources={"CPU": 2.0})["workers"] == 2
    assert s2.register("d", fixed=True, min_workers=1, max_workers=1, resources={"CPU": 2.0})["workers"] == 0


def test_status_lists_jobs_allocation_goodput_and_speedup():
    s = state()
    s.register("a", min_workers=1, max_workers=4)
    s.report("a", {**MODEL, "nodes": ["node-a"]})
    job = s.status()["jobs"][0]
    assert job["workers"] == 4 and job["goodput"] > 0 and job["speedup"] > 1
    assert s.status()["nodes"] == {"node-a": 2, "node-b": 2}


@pytest.mark.parametrize("fields, match", [
    ({"min_workers": 0}, "min_workers"), ({"min_workers": 3, "max_workers": 2}, "max_workers"),
    ({"weight": -1}, "weight"), ({"min_workers": "x"}, "not a number"),
])
def test_bad_registrations_say_which_field(fields, match):
    with pytest.raises(ValueError, match=match):
        state().register("a", **fields)


def test_the_stale_limit_has_a_named_default():
    assert state().stale_after_s == STALE_AFTER_S
    with pytest.raises(ValueError, match="stale_after_s"):
        state(stale_after_s=0)


def test_a_heavier_run_gets_more_of_the_slots_and_status_shows_its_weight():
    """Two runs of the same model on 4 slots: equal weights share 2 and 2; weight 3
    against 1 moves slots to the heavier (the weighted power mean)."""
    from raylight.adaptive.sharing import SharingPolicy
    from raylight.scheduler.state import _goodput

    def shares(weight_b: float) -> dict[str, int]:
        jobs = [JobModel(j, _goodput(MODEL), max_replicas=4, weight=w) for j, w in (("a", 1.0), ("b", weight_b))]
        return SharingPolicy().allocate(jobs, [2, 2]).replicas()

    even, heavy = shares(1.0), shares(3.0)
    assert even == {"a": 2, "b": 2}
    assert heavy["b"] > heavy["a"] and sum(heavy.values()) <= 4
    s = state()
    s.register("b", min_workers=1, max_workers=4, weight=3.0)
    assert s.status()["jobs"][0]["weight"] == 3.0

"""A run's part in the cluster's scheduler, without Ray: the scheduler's real bookkeeping
(``SchedulerState`` on made-up nodes) stands in for the actor."""

from __future__ import annotations

import logging

import pytest

from raylight.adaptive.goodput import PerfParams, predict_step_time
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.profile import StepProfile
from raylight.config.schema import ScalingConfig, TrainerConfig
from raylight.driver.controller import Controller, FailurePolicy, FixedScalingPolicy, Resize, State
from raylight.driver.controller.cluster_share import ClusterShare, goodput_model
from raylight.scheduler.state import SchedulerState
from raylight.worker.protocol import GroupPoll, WorkerPoll
from tests.driver.test_controller import FakeGroup, failed, finished, recorder, running  # noqa: F401
from tests.driver.test_scaling_policy import Clock, policy, view
from tests.scheduler.test_state import MODEL

NODES = {"n1": {"CPU": 2.0}, "n2": {"CPU": 2.0}}


class Link:
    """The actor's three calls over a SchedulerState; ``down`` answers nothing, as a
    scheduler that timed out or died."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        self.down = False
        self.calls: list[str] = []

    def register(self, job_id, **fields):
        self.calls.append("register")
        return None if self.down else self.state.register(job_id, **fields)

    def report(self, job_id, model, **fields):
        self.calls.append("report")
        return None if self.down else self.state.report(job_id, model, **fields)

    def unregister(self, job_id):
        self.calls.append("unregister")
        if not self.down:
            self.state.unregister(job_id)


def scalable_poll() -> GroupPoll:
    """Rank 0's measurements of 1 and 2 workers of a model whose step is mostly compute:
    more workers are worth it."""
    perf = PerfParams(0.01, 1e-2, 0.002, 0.0, 0.001, 0.0, 1.0)
    prof = StepProfile()
    for r in (1, 2):
        for m in (8, 16):
            for _ in range(5):
                prof.add((1, r, m, 1), optim_time=float(predict_step_time(perf, 1, r, m, 0)))
    return GroupPoll([WorkerPoll(0, "running", adaptive=AdaptiveStats(prof.to_json(), BatchPlan(8), 16, 1.0, 50.0, 1.0, 0.0, 1))])


def share(link, job_id, *, fixed=True, low=2, high=2, **kw) -> ClusterShare:
    return ClusterShare(link, job_id, fixed=fixed, min_workers=low, max_workers=high, resources={"CPU": 1.0}, **kw)


@pytest.fixture
def link():
    return Link(SchedulerState(lambda: NODES, clock=Clock()))


def test_a_fixed_run_waits_for_its_size_naming_the_runs_that_hold_it(link):
    a, b = share(link, "a", low=4, high=4), share(link, "b")
    assert a.admit(0.0, lambda: 4) == "" and a.workers == 4
    assert b.admit(0.0, lambda: 0) == "waiting for 2 CPU slot(s): 0 of 4 free, held by runs a"
    assert b.workers is None
    a.close()
    assert b.admit(2.0, lambda: 4) == "" and b.workers == 2
    assert link.calls == ["register", "register", "unregister", "report"]


def test_an_admitted_run_still_waits_until_its_minimum_fits(link):
    """The scheduler gave the slots, but the runs it shrank have not let them go yet."""
    b = share(link, "b")
    assert "2 free" not in b.admit(0.0, lambda: 1)
    assert "other runs are shrinking to their share" in b.admit(0.0, lambda: 1)
    assert b.admit(1.0, lambda: 2) == ""


def test_a_scheduler_that_does_not_answer_leaves_the_run_its_last_allocation(link):
    a = share(link, "a", fixed=False, low=1, high=4)
    link.down = True
    assert a.admit(0.0, lambda: 4) == "" and a.workers is None  # starts as it would without one
    link.down = False
    assert a.admit(0.0, lambda: 4) == "" and a.workers == 1
    link.down = True
    a.tick(100.0, ["n1"])
    assert a.workers == 1 and [r["workers"] for r in a.history] == [1]


def test_reports_go_after_an_offer_and_every_interval_and_each_new_allocation_is_a_row(link):
    rows: list[dict] = []
    a = share(link, "a", fixed=False, low=1, high=4, report_interval_s=10.0, event=rows.append)
    a.admit(0.0, lambda: 4)
    link.calls.clear()
    a.tick(1.0, ["n1"])
    assert link.calls == []  # nothing new, not due
    a.offer({"resize_cost_s": 1.0})
    a.tick(2.0, ["n1"])
    a.tick(11.0, ["n1"])
    assert link.calls == ["report"]
    a.tick(12.0, ["n1"])
    assert link.calls == ["report", "report"]
    assert [r["event"] for r in rows] == ["allocation"] and rows[0]["workers"] == 1  # unchanged since
    assert link.state.jobs["a"].model["nodes"] == ["n1"]


def test_an_elastic_run_takes_its_allocation_as_its_size(link):
    """The policy offers its goodput model at each decision and resizes to what the
    scheduler gives it; growing only to what fits now."""
    clock = Clock()
    shared = share(link, "a", fixed=False, low=1, high=4)
    p = policy(clock=clock)
    p.share = shared
    assert shared.admit(0.0, lambda: 4) == ""
    assert p.start_size(lambda: 4) == 1  # the allocation of a run with no model yet
    p.observe(scalable_poll())
    clock.now = 2.0
    first = p.decide(view(2.0, scalable_poll(), workers=1, capacity=4))
    assert not any(isinstance(d, Resize) for d in first)  # the model goes at the tick, the allocation is 1 yet
    model = goodput_model(p.engine, num_workers=1, threads=1)
    assert len(model["perf"]) == 7 and model["atomic_bsz_range"] == [4, 64]
    shared.tick(2.0, ["n1"])
    allocated = shared.workers
    assert allocated == 4  # a fitted model: worth every slot, alone on the cluster
    clock.now = 4.0
    [resize] = [d for d in p.decide(view(4.0, scalable_poll(), workers=1, capacity=4)) if isinstance(d, Resize)]
    assert isinstance(resize, Resize) and resize.num_workers == allocated and resize.in_place
    assert resize.reason == f"the raylight scheduler's allocation: {allocated} worker(s)"
    clock.now = 6.0
    [fits] = [d for d in p.decide(view(6.0, scalable_poll(), workers=1, capacity=3)) if isinstance(d, Resize)]
    assert fits.num_workers == 3 and fits.reason == "the raylight scheduler's allocation: 4 worker(s), 3 fit now"


def test_the_controller_waits_for_the_size_then_trains_and_unregisters(link, recorder, caplog):  # noqa: F811
    holder = share(link, "holder", low=3, high=3)
    holder.admit(0.0, lambda: 4)
    run = share(link, "run")
    group = FakeGroup([running(), finished()])
    waits: list[float] = []
    c = Controller(group=group, recorder=recorder, failure_policy=FailurePolicy(0),
                   scaling_policy=FixedScalingPolicy(2, 1), share=run, sleep=waits.append)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert c.step() is State.INITIALIZING and c.step() is State.INITIALIZING
    assert c.waiting == "waiting for 2 CPU slot(s): 1 of 4 free, held by runs holder" and len(waits) == 2
    assert sum("held by runs holder" in r.getMessage() for r in caplog.records) == 1  # said once
    holder.close()
    assert c.step() is State.SCHEDULING and c.waiting == ""
    c.run()
    assert c.state is State.FINISHED and "run" not in link.state.jobs


def test_a_failed_run_unregisters_too(link, recorder):  # noqa: F811
    run = share(link, "run")
    c = Controller(group=FakeGroup([failed()]), recorder=recorder, failure_policy=FailurePolicy(0),
                   scaling_policy=FixedScalingPolicy(2, 1), share=run)
    c.run()
    assert c.state is State.ERRORED and link.calls[-1] == "unregister" and not link.state.jobs


def test_without_a_scheduler_a_run_holds_no_share(monkeypatch):
    from raylight.driver import scheduler_link
    from raylight.driver.trainer import build_scaling_policy, cluster_share

    monkeypatch.setattr(scheduler_link, "find_link", lambda: None)
    cfg = TrainerConfig(scaling=ScalingConfig(num_workers=(1, 4)))
    assert cluster_share(cfg, "run") is None
    assert build_scaling_policy(cfg).share is None


def test_fixed_runs_register_their_one_size_and_elastic_ones_their_bounds(monkeypatch, link):
    from raylight.driver import scheduler_link
    from raylight.driver.trainer import cluster_share

    monkeypatch.setattr(scheduler_link, "find_link", lambda: link)
    fixed = cluster_share(TrainerConfig(scaling=ScalingConfig(num_workers=3)), "f")
    elastic = cluster_share(TrainerConfig(scaling=ScalingConfig(num_workers=(1, 4))), "e")
    assert (fixed.fixed, fixed.fields["min_workers"], fixed.fields["max_workers"]) == (True, 3, 3)
    assert (elastic.fixed, elastic.fields["min_workers"], elastic.fields["max_workers"]) == (False, 1, 4)


def test_the_ray_link_times_out_naming_its_setting_and_finds_a_scheduler_started_again(monkeypatch, caplog):
    """RayLink without Ray: ray.get stands in, answering as a slow, then dead, then new actor."""
    import ray.exceptions

    from raylight.driver import scheduler_link
    from raylight.scheduler import actor

    class Handle:
        def __init__(self, name):
            self.report = type("M", (), {"remote": staticmethod(lambda *a, **k: name)})()

    answers = {"slow": ray.exceptions.GetTimeoutError(), "dead": ray.exceptions.RayActorError()}

    def get(ref, timeout):
        assert timeout == scheduler_link.CALL_TIMEOUT_S
        if ref in answers:
            raise answers[ref]
        return {"workers": 3}

    monkeypatch.setattr(scheduler_link.ray, "get", get)
    link = scheduler_link.RayLink(Handle("slow"))
    with caplog.at_level(logging.WARNING, logger="raylight"):
        assert link.report("a", {}) is None
    assert "CALL_TIMEOUT_S=5" in caplog.text
    link.handle = Handle("dead")
    assert link.report("a", {}) is None and link.gone
    monkeypatch.setattr(actor, "find", lambda: None)
    assert link.report("a", {}) is None  # none runs: the run keeps its allocation
    monkeypatch.setattr(actor, "find", lambda: Handle("new"))
    assert link.report("a", {}) == {"workers": 3} and not link.gone


def test_the_ray_link_keeps_a_busy_run_known_until_it_unregisters(monkeypatch):
    """A start or a resize can hold the controller for minutes: the link's thread repeats
    the last report meanwhile, and stops at unregister."""
    from raylight.driver import scheduler_link
    from tests.helpers import wait_until

    calls: list[tuple] = []

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args, **kwargs):
            calls.append((self.name, args, kwargs))
            return self.name

    handle = type("H", (), {n: Method(n) for n in ("register", "report", "unregister")})()
    monkeypatch.setattr(scheduler_link.ray, "get", lambda ref, timeout: {"workers": 1})
    link = scheduler_link.RayLink(handle, keepalive_s=0.05)
    link.register("a", min_workers=1)
    link.report("a", {"resize_cost_s": 2.0}, min_workers=1)
    wait_until(lambda: len(calls) >= 3, 30, "a keepalive report")
    assert calls[2] == ("report", ("a", {"resize_cost_s": 2.0}), {"min_workers": 1})  # the last report, again
    link.unregister("a")
    assert calls[-1] == ("unregister", ("a",), {}) and link._thread is not None and not link._thread.is_alive()


def test_raylight_report_shows_the_allocations(tmp_path):
    import json

    from rich.console import Console

    from raylight.driver.report import load_report, render_report

    path = tmp_path / "run"
    path.mkdir()
    (path / "status.json").write_text(json.dumps({"state": "finished"}))
    rows = [
        {"event": "allocation", "time": 0.0, "workers": 0, "nodes": [], "speedup": 0.0, "waiting": "waiting for 2 CPU slot(s): 0 of 4 free, held by runs a"},
        {"event": "allocation", "time": 4.0, "workers": 3, "nodes": ["n1", "n1", "n2"], "speedup": 2.5, "waiting": ""},
    ]
    (path / "adaptive.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    console = Console(record=True, width=200)
    render_report(load_report(str(path)), console)
    text = console.export_text()
    assert "held by runs a" in text
    assert "+4.0s" in text and "the raylight scheduler's share, on 2 node(s), speedup 2.50" in text


def test_a_run_reports_what_a_re_allocation_really_cost_it():
    """From the scheduler's answer of a new size to the first tick at that size (the
    controller ticks once the resize's first step is in): the model then carries that
    cost where it exceeds the engine's own measure, and the scheduler's penalty uses it."""
    state = SchedulerState(lambda: NODES, clock=Clock())
    link = Link(state)
    a = share(link, "a", fixed=False, low=1, high=4)
    a.admit(0.0, lambda: 4)
    a.tick(1.0, ["n1"])
    a.offer({**MODEL, "resize_cost_s": 0.3})  # the engine measured 0.3 s from its own decision
    a.tick(2.0, ["n1"])  # answered 4
    assert a.workers == 4 and a.resize_costs == []
    a.tick(20.0, ["n1", "n1"])  # not there yet
    a.tick(27.5, ["n1", "n1", "n2", "n2"])
    assert a.resize_costs == [25.5]
    a.offer({**MODEL, "resize_cost_s": 0.3})
    a.tick(28.0, ["n1", "n1", "n2", "n2"])
    assert state.jobs["a"].model["resize_cost_s"] == 25.5


def test_the_run_s_scheduler_weight_is_sent_with_its_registration(monkeypatch, link):
    from raylight.driver import scheduler_link
    from raylight.driver.trainer import cluster_share

    monkeypatch.setattr(scheduler_link, "find_link", lambda: link)
    heavy = cluster_share(TrainerConfig(scaling=ScalingConfig(num_workers=(1, 4), scheduler_weight=2.5)), "h")
    heavy.admit(0.0, lambda: 4)
    assert link.state.status()["jobs"][0]["weight"] == 2.5
    assert ScalingConfig().scheduler_weight == 1.0
    with pytest.raises(ValueError, match="scheduler_weight"):
        ScalingConfig(scheduler_weight=0)

"""The control plane stepped one state at a time against a fake worker group."""

from __future__ import annotations

import pickle

import pytest

from raylight.checkpoint import serialize_state
from raylight.controller import Controller, FailurePolicy, ResizeDecision, State
from raylight.controller.decisions import ContinueDecision
from raylight.exceptions import (
    InsufficientResourcesError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerStartError,
)
from raylight.recorder import RunRecorder
from raylight.storage import RunStorage
from raylight.worker_group.protocol import (
    BatchPlan,
    ErrorInfo,
    GroupPoll,
    Report,
    ResizeOutcome,
    WorkerFailure,
    WorkerPoll,
)


class FakeGroup:
    def __init__(self, polls, start_errors=(), resize_outcomes=(), capacity=8, placeable=None):
        self.polls = list(polls)
        self.placeable = placeable  # how many workers reserve() can place (None: any)
        self.reserves: list[tuple[int, int]] = []
        self.start_errors = list(start_errors)
        self.resize_outcomes = list(resize_outcomes)
        self.starts: list[tuple[int, object]] = []
        self.resizes: list[dict] = []
        self.plans: list[BatchPlan] = []
        self.shutdowns = 0
        self._capacity = capacity
        self._size = 0

    def set_plan(self, plan):
        self.plans.append(plan)

    def capacity(self):
        return self._capacity

    def request_resources(self, num_workers):
        pass

    def reserve(self, num_workers, *, at_least):
        self.reserves.append((num_workers, at_least))
        placed = num_workers if self.placeable is None else min(num_workers, self.placeable)
        if placed < at_least:
            raise InsufficientResourcesError(f"only {self.placeable} fit")
        return placed

    def resize(self, *, num_workers, threads, plan, commit):
        self.resizes.append({"num_workers": num_workers, "threads": threads, "plan": plan, "commit": commit})
        outcome = self.resize_outcomes.pop(0)
        if outcome.kind == "in_place":
            self._size = num_workers
        return outcome

    @property
    def num_workers(self):
        return self._size

    def start(self, *, num_workers, checkpoint, threads=None, plan=None):
        self._size = num_workers
        self.starts.append((num_workers, checkpoint))
        if self.start_errors:
            err = self.start_errors.pop(0)
            if err is not None:
                raise err

    def poll(self):
        return self.polls.pop(0)

    def shutdown(self):
        self.shutdowns += 1


def running(*reports, n=2):
    return GroupPoll([WorkerPoll(0, "running", list(reports))] + [WorkerPoll(r, "running") for r in range(1, n)])


def finished(n=2):
    return GroupPoll([WorkerPoll(r, "finished") for r in range(n)])


def failed(kind="died", rank=1, **kw):
    return GroupPoll([WorkerPoll(0, "running")], [WorkerFailure(rank, kind, f"{kind} here", node="127.0.0.1", pid=42, **kw)])


def ckpt_report(epoch):
    return Report({"epoch": epoch}, serialize_state({"epoch": epoch}))


@pytest.fixture
def recorder(tmp_path):
    rec = RunRecorder(RunStorage(str(tmp_path / "run")), checkpoints_to_keep=2)
    rec.open({}, resume=False)
    return rec


def make(group, recorder, max_failures=0, n=2, scaling=None):
    return Controller(
        group=group,
        recorder=recorder,
        num_workers=n,
        failure_policy=FailurePolicy(max_failures),
        scaling_policy=scaling,
    )


def test_happy_path_states(recorder):
    group = FakeGroup([running(ckpt_report(0)), running(), finished()])
    c = make(group, recorder)
    assert c.state is State.INITIALIZING
    assert c.step() is State.SCHEDULING
    assert c.step() is State.RUNNING
    assert group.starts == [(2, None)]
    assert c.step() is State.RUNNING
    assert recorder.history == [{"epoch": 0}]
    assert c.step() is State.RUNNING
    assert c.step() is State.FINISHED
    assert group.shutdowns == 1


def test_restart_from_last_checkpoint_then_finish(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"epoch": 1})), failed("died"), running(ckpt_report(1)), finished()]
    )
    c = make(group, recorder, max_failures=1)
    for _ in range(4):
        c.step()
    assert c.state is State.RUNNING
    assert c.step() is State.RESTARTING
    assert c.num_failures == 1
    assert c.step() is State.SCHEDULING
    assert recorder.history == [{"epoch": 0}], "the uncommitted report is rolled back"
    assert c.step() is State.RUNNING
    num, ckpt = group.starts[-1]
    assert num == 2 and ckpt is not None and ckpt.load() == {"epoch": 0}
    c.step()
    assert c.step() is State.FINISHED
    assert recorder.history == [{"epoch": 0}, {"epoch": 1}]


def test_gives_up_after_max_failures(recorder):
    group = FakeGroup([failed("died"), failed("died")])
    c = make(group, recorder, max_failures=1)
    c.step(), c.step()
    assert c.step() is State.RESTARTING
    c.step(), c.step()
    assert c.step() is State.ERRORED
    assert isinstance(c.error, WorkerDiedError)
    text = str(c.error)
    assert "worker rank 1 (node 127.0.0.1, pid 42) died here" in text
    assert "max_failures=1" in text and "failed 2 time(s)" in text
    assert c.error.rank == 1 and c.error.num_failures == 2


def test_unlimited_failures(recorder):
    group = FakeGroup([failed()] * 5 + [finished()])
    c = make(group, recorder, max_failures=-1)
    c.run()
    assert c.state is State.FINISHED and c.num_failures == 5 and len(group.starts) == 6


def test_hang_error_names_the_timeout_setting(recorder):
    c = make(FakeGroup([failed("hang")]), recorder)
    c.run()
    assert isinstance(c.error, WorkerHangError)
    assert "hang_timeout_s" in str(c.error) and "ctx.heartbeat()" in str(c.error)


def test_worker_exception_carries_type_message_traceback_and_cause(recorder):
    info = ErrorInfo("ValueError", "boom", "Traceback...\n  in explode\nValueError: boom")
    c = make(FakeGroup([failed("error", error=info, cause=ValueError("boom"))]), recorder)
    c.run()
    err = c.error
    assert isinstance(err, WorkerError)
    assert err.exc_type == "ValueError" and err.exc_message == "boom" and "in explode" in err.worker_traceback
    assert "in explode" in str(err) and isinstance(err.__cause__, ValueError)
    assert pickle.loads(pickle.dumps(err)).worker_traceback == err.worker_traceback


def test_insufficient_resources_is_not_retried(recorder):
    group = FakeGroup([], start_errors=[InsufficientResourcesError("3 workers need CPU: 3")])
    c = make(group, recorder, max_failures=5)
    c.run()
    assert c.state is State.ERRORED and isinstance(c.error, InsufficientResourcesError)
    assert len(group.starts) == 1


def test_start_timeout_counts_as_failure(recorder):
    group = FakeGroup([finished()], start_errors=[WorkerStartError("rendezvous timed out"), None])
    c = make(group, recorder, max_failures=1)
    c.run()
    assert c.state is State.FINISHED and c.num_failures == 1


def test_root_cause_first():
    died = WorkerFailure(1, "died", "x")
    echo = WorkerFailure(0, "error", "connection closed")
    slow = WorkerFailure(0, "hang", "y", seconds_since_progress=5)
    stuck = WorkerFailure(2, "hang", "z", seconds_since_progress=9)
    assert GroupPoll.root_cause_first([echo, died]) == [died, echo]
    assert GroupPoll.root_cause_first([slow, stuck]) == [stuck, slow]
    first = WorkerFailure(1, "error", "boom", error=ErrorInfo("ValueError", "boom", "", time=10.0))
    later = WorkerFailure(0, "error", "gloo", error=ErrorInfo("RuntimeError", "gloo", "", time=10.5))
    assert GroupPoll.root_cause_first([later, first]) == [first, later]


class ResizeOnce:
    def __init__(self, to, after=1):
        self.to = to
        self.after = after

    def decide(self, poll, *, num_workers):
        self.after -= 1
        if self.after != 0:
            return ContinueDecision()
        return ResizeDecision(self.to, "test")


def test_resize_in_place_keeps_workers_and_rolls_back_to_the_commit(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"epoch": 1})), finished(n=3)],
        resize_outcomes=[ResizeOutcome("in_place")],
    )
    c = make(group, recorder, scaling=ResizeOnce(3, after=2))
    c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.RUNNING
    assert group.resizes == [{"num_workers": 3, "threads": 1, "plan": None, "commit": 0}]
    assert len(group.starts) == 1, "no new group: the survivors kept running"
    assert recorder.history == [{"epoch": 0}], "reports after the commit are rolled back"
    assert c.num_workers == 3 and c.num_failures == 0 and c.num_restarts == 1
    assert c.step() is State.FINISHED


def test_resize_falls_back_to_the_checkpoint_path(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), finished(n=3)],
        resize_outcomes=[ResizeOutcome("fallback", reason="no live worker holds checkpoint 0")],
    )
    c = make(group, recorder, scaling=ResizeOnce(3))
    c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.SCHEDULING
    assert c.step() is State.RUNNING
    assert group.starts[-1][0] == 3 and group.starts[-1][1].load() == {"epoch": 0}
    assert c.num_failures == 0 and c.num_restarts == 1
    assert c.resizes == [] and c._watch["kind"] == "checkpoint"
    assert c.step() is State.FINISHED


def test_elastic_run_shrinks_in_place_when_a_worker_dies(recorder):
    group = FakeGroup([running(ckpt_report(0)), failed("died"), finished(n=1)], resize_outcomes=[ResizeOutcome("in_place")])
    c = Controller(
        group=group, recorder=recorder, num_workers=2, failure_policy=FailurePolicy(0),
        elastic=True, min_workers=1, max_workers=2,
    )
    c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING, "a lost worker in an elastic run is a resize, not a failure"
    assert c.step() is State.RUNNING
    assert group.resizes[0]["num_workers"] == 1 and c.num_failures == 0
    assert c.step() is State.FINISHED


def test_elastic_start_runs_what_the_cluster_places(recorder):
    """The start size comes from a view of free resources that can be stale: the group
    places what it can, down to min_workers, and the run starts at that size."""
    group = FakeGroup([running(n=2), finished(n=2)], placeable=2)
    c = Controller(
        group=group, recorder=recorder, num_workers=3, failure_policy=FailurePolicy(0),
        elastic=True, min_workers=1, max_workers=4, threads_for=lambda k: 6 // k,
    )
    c.step()
    assert c.step() is State.RUNNING
    assert group.reserves == [(3, 1)] and group.starts[-1][0] == 2
    assert c.num_workers == 2 and c.threads == 3


def test_elastic_start_fails_when_not_even_min_workers_fit(recorder):
    group = FakeGroup([], placeable=1)
    c = Controller(
        group=group, recorder=recorder, num_workers=3, failure_policy=FailurePolicy(0),
        elastic=True, min_workers=2, max_workers=4,
    )
    c.step()
    assert c.step() is State.ERRORED and group.starts == []
    assert isinstance(c.error, InsufficientResourcesError)


def test_fixed_size_start_reserves_nothing_first(recorder):
    group = FakeGroup([running(), finished()])
    c = make(group, recorder)
    c.step(), c.step()
    assert group.reserves == [] and group.starts[0][0] == 2


def test_resize_never_goes_outside_min_and_max(recorder):
    group = FakeGroup([running(), finished(n=4)], resize_outcomes=[ResizeOutcome("in_place")])
    c = Controller(
        group=group, recorder=recorder, num_workers=2, failure_policy=FailurePolicy(0),
        scaling_policy=ResizeOnce(16), elastic=True, min_workers=1, max_workers=4,
    )
    c.step(), c.step(), c.step()
    c.step()
    assert group.resizes[0]["num_workers"] == 4


def test_shutdown_on_driver_interrupt(recorder):
    class Interrupting(FakeGroup):
        def poll(self):
            raise KeyboardInterrupt

    group = Interrupting([])
    c = make(group, recorder)
    with pytest.raises(KeyboardInterrupt):
        c.run()
    assert group.shutdowns >= 1


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_engine_decisions_reach_the_group(recorder):
    from raylight.adaptive.engine import AdaptiveEngine, EngineSettings
    from raylight.adaptive.goodput import PerfParams, predict_step_time
    from raylight.adaptive.profile import StepProfile
    from raylight.config.schema import AdaptiveConfig, ScalingConfig
    from raylight.worker_group.protocol import AdaptiveStats

    perf = PerfParams(0.01, 1e-4, 0.05, 0.01, 0.02, 0.005, 1.0)
    prof = StepProfile()
    for m in (8, 16):
        for _ in range(5):
            prof.add((1, 2, m, 1), optim_time=float(predict_step_time(perf, 1, 2, m, 0)))
    stats = AdaptiveStats(prof.to_json(), BatchPlan(8), 16, 1.0, 50.0, 1.0, 0.0, 1)
    poll = GroupPoll([WorkerPoll(0, "running", adaptive=stats), WorkerPoll(1, "running")])
    group = FakeGroup([poll, running(), running()], capacity=2)
    requested = []
    group.request_resources = requested.append
    eng = AdaptiveEngine(EngineSettings.from_config(ScalingConfig(num_workers=(1, 4), scaling_policy="max"), AdaptiveConfig(max_batch_size=256, local_batch_bounds=(4, 64), min_profile_steps=3)))
    clock = Clock()
    trace = []
    c = Controller(
        group=group, recorder=recorder, num_workers=2, failure_policy=FailurePolicy(0), engine=eng,
        elastic=True, min_workers=1, max_workers=4, decision_interval_s=1.0, resize_interval_s=1.0,
        autoscale=True, trace=trace.append, clock=clock,
    )
    c.step(), c.step()
    clock.now = 5.0
    assert c.step() is State.RUNNING
    assert group.plans and group.plans[0].version == 1 and group.plans[0].global_batch(2) > 16
    assert trace and trace[-1]["decision"] == "batch"
    assert requested == [4], "more workers would help than fit: ask the autoscaler"


def test_trace_rows_report_the_samples_per_second_since_the_previous_row(recorder):
    """Each row's throughput covers the same interval as its measured step time, not the
    display's 5 s window, which would lag a batch change by 5 s."""
    from raylight.adaptive.engine import AdaptiveEngine, EngineSettings
    from raylight.config.schema import AdaptiveConfig, ScalingConfig
    from raylight.worker_group.protocol import Progress

    def at(samples):  # both workers at ``samples`` each
        return GroupPoll([WorkerPoll(r, "running", progress=Progress(samples=samples)) for r in range(2)])

    # 100 samples/s in all for 10 s, then 1,000 samples/s.
    polls = [at(0), *(at(50 * t) for t in range(1, 11)), *(at(500 + 500 * t) for t in range(1, 6))]
    group = FakeGroup(polls)
    eng = AdaptiveEngine(EngineSettings.from_config(ScalingConfig(num_workers=2), AdaptiveConfig()))
    clock, trace = Clock(), []
    c = Controller(
        group=group, recorder=recorder, num_workers=2, failure_policy=FailurePolicy(0), engine=eng,
        decision_interval_s=2.0, trace=trace.append, clock=clock,
    )
    c.step(), c.step(), c.step()  # initialise, schedule, then the first poll at t=0
    for t in range(1, 16):
        clock.now = float(t)
        c.step()
    rates = [row["throughput"] for row in trace]
    assert len(rates) == 7  # rows at t = 2, 4, ..., 14
    assert rates[1:] == [pytest.approx(100.0)] * 4 + [pytest.approx(1000.0)] * 2  # the new rate at once

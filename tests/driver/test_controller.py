"""The control plane stepped one state at a time against a fake worker group."""

from __future__ import annotations

import pickle

import pytest

from raylight.adaptive.plan import BatchPlan
from raylight.base.cost import WorkerPlace
from raylight.base.exceptions import (
    InsufficientResourcesError,
    PreemptedError,
    TrainingFailedError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerImportError,
    WorkerStartError,
)
from raylight.driver.controller import (
    Controller,
    FailurePolicy,
    FixedScalingPolicy,
    Raise,
    RequestResources,
    Resize,
    Restart,
    RunTelemetry,
    SetPlan,
    State,
)
from raylight.driver.recorder import RunRecorder
from raylight.storage.checkpoint import serialize_state
from raylight.storage.run_dir import RunStorage
from raylight.worker.protocol import (
    ErrorInfo,
    GroupPoll,
    NodeNotice,
    Report,
    ResizeOutcome,
    WorkerFailure,
    WorkerPoll,
)


class FakeGroup:
    def __init__(self, polls, start_errors=(), resize_outcomes=(), capacity=8, placeable=None, stopped_reports=()):
        self.polls = list(polls)
        # Reports each resize hands to on_stopped once the workers stopped, before the
        # group re-forms; after_stop() runs right after (what a test looks at then).
        self.stopped_reports = list(stopped_reports)
        self.after_stop = lambda: None
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

    def resize(self, *, num_workers, threads, plan, commit, target=None, leaving=frozenset(), snapshot=False,
               on_stopped=None):
        self.resizes.append({
            "num_workers": num_workers, "threads": threads, "plan": plan, "commit": commit,
            "leaving": leaving, "snapshot": snapshot,
        })
        outcome = self.resize_outcomes.pop(0)
        if on_stopped is not None and self.stopped_reports:
            on_stopped(self.stopped_reports.pop(0))
            self.after_stop()
        if outcome.kind == "in_place":
            self._size = num_workers
        return outcome

    @property
    def num_workers(self):
        return self._size

    def start(self, *, num_workers, checkpoint, threads=None, plan=None, target=None):
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


class ScriptedPolicy(FixedScalingPolicy):
    """A fake scaling policy: ``script[i]`` is what its i-th ``decide`` returns; an
    elastic one accepts down to ``fewest`` workers and resizes to survivors on a loss."""

    def __init__(self, n=2, script=(), *, fewest=None, threads=lambda k: 1, on_lost=False, restart=None):
        super().__init__(n, 1)
        self.script = list(script)
        self._fewest = fewest
        self._threads_for = threads
        self._on_lost = on_lost
        self._restart = restart
        self.started_sizes: list[int] = []
        self.observed = 0
        self.restart_costs: list[float] = []

    def fewest(self, num_workers):
        return num_workers if self._fewest is None else min(self._fewest, num_workers)

    def restart_size(self, num_workers):
        return self._restart if self._restart is not None else num_workers

    def threads(self, num_workers):
        return self._threads_for(num_workers)

    def started(self, num_workers):
        self.started_sizes.append(num_workers)

    def observe(self, poll):
        self.observed += 1

    def decide(self, view):
        return self.script.pop(0) if self.script else []

    def on_lost(self, num_workers, lost):
        return Resize(num_workers - lost, "lost") if self._on_lost else None

    def record_restart(self, seconds):
        self.restart_costs.append(seconds)


def make(group, recorder, max_failures=0, n=2, policy=None):
    return Controller(
        group=group,
        recorder=recorder,
        failure_policy=FailurePolicy(max_failures),
        scaling_policy=policy or FixedScalingPolicy(n, 1),
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


def test_a_worker_that_fails_to_join_the_group_makes_the_run_form_it_again(recorder):
    """A rendezvous error (a peer's gloo connection closed while the group formed, seen in
    the suite on a loaded machine) gets FailureConfig.rendezvous_retries new groups, not
    counted against max_failures; past them, or for an error in the loop, the run fails."""
    joining = ErrorInfo("RuntimeError", "Gloo connectFullMesh failed", "Traceback...", rendezvous=True)
    group = FakeGroup([failed("error", error=joining), running(ckpt_report(0)), finished()])
    c = Controller(group=group, recorder=recorder, failure_policy=FailurePolicy(0, rendezvous_retries=1),
                   scaling_policy=FixedScalingPolicy(2, 1))
    c.run()
    assert c.state is State.FINISHED and c.num_failures == 0 and c.rendezvous_retries == 1
    assert len(group.starts) == 2 and group.shutdowns >= 1

    twice = FakeGroup([failed("error", error=joining), failed("error", error=joining)])
    c = Controller(group=twice, recorder=recorder, failure_policy=FailurePolicy(0, rendezvous_retries=1),
                   scaling_policy=FixedScalingPolicy(2, 1))
    c.run()
    assert isinstance(c.error, WorkerError) and c.error.exc_type == "RuntimeError" and len(twice.starts) == 2

    in_loop = ErrorInfo("RuntimeError", "Gloo connectFullMesh failed", "Traceback...")  # the loop's own group
    c = Controller(group=FakeGroup([failed("error", error=in_loop)]), recorder=recorder,
                   failure_policy=FailurePolicy(0, rendezvous_retries=1), scaling_policy=FixedScalingPolicy(2, 1))
    c.run()
    assert isinstance(c.error, WorkerError) and c.rendezvous_retries == 0


def test_insufficient_resources_is_not_retried(recorder):
    group = FakeGroup([], start_errors=[InsufficientResourcesError("3 workers need CPU: 3")])
    c = make(group, recorder, max_failures=5)
    c.run()
    assert c.state is State.ERRORED and isinstance(c.error, InsufficientResourcesError)
    assert len(group.starts) == 1


def test_a_module_the_workers_cannot_import_is_not_retried(recorder):
    missing = WorkerImportError("the workers cannot import module 'helper'", module="helper")
    group = FakeGroup([finished()], start_errors=[missing, None])
    c = make(group, recorder, max_failures=5)
    c.run()
    assert c.state is State.ERRORED and c.error is missing and c.num_failures == 0
    assert len(group.starts) == 1


def test_a_start_failure_past_max_failures_names_no_rank(recorder):
    c = make(FakeGroup([], start_errors=[WorkerStartError("a worker failed to start the training loop: boom")]), recorder)
    c.run()
    assert isinstance(c.error, TrainingFailedError) and c.error.rank is None
    assert str(c.error).startswith("a worker failed to start the training loop: boom. The run failed 1 time(s)")


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


def test_resize_in_place_keeps_workers_and_rolls_back_to_the_commit(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"epoch": 1})), finished(n=3)],
        resize_outcomes=[ResizeOutcome("in_place")],
    )
    policy = ScriptedPolicy(2, [[], [Resize(3, "test")]])
    c = make(group, recorder, policy=policy)
    c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.phase.resize == Resize(3, "test"), "the pending decision rides in the phase"
    assert c.step() is State.RUNNING
    assert group.resizes == [
        {"num_workers": 3, "threads": 1, "plan": None, "commit": 0, "leaving": frozenset(), "snapshot": False}
    ]
    assert len(group.starts) == 1, "no new group: the survivors kept running"
    assert recorder.history == [{"epoch": 0}], "reports after the commit are rolled back"
    assert c.num_workers == 3 and c.num_failures == 0 and c.num_restarts == 1
    assert policy.started_sizes == [2, 3]
    assert c.step() is State.FINISHED


def test_resize_falls_back_to_the_checkpoint_path(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), finished(n=3)],
        resize_outcomes=[ResizeOutcome("fallback", reason="no live worker holds checkpoint 0")],
    )
    c = make(group, recorder, policy=ScriptedPolicy(2, [[Resize(3, "test")]]))
    c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.SCHEDULING
    assert c.step() is State.RUNNING
    assert group.starts[-1][0] == 3 and group.starts[-1][1].load() == {"epoch": 0}
    assert c.num_failures == 0 and c.num_restarts == 1
    assert c.resizes == [] and c.telemetry.watch["kind"] == "checkpoint"
    assert c.telemetry.watch["fallback"] == "no live worker holds checkpoint 0", "the trace says why"
    assert c.step() is State.FINISHED


def test_a_grow_that_gets_no_new_worker_leaves_the_group_untouched(recorder):
    group = FakeGroup(
        [running(ckpt_report(0)), running(), finished()],
        resize_outcomes=[ResizeOutcome("unchanged", reason="the cluster placed no new worker")],
    )
    c = make(group, recorder, policy=ScriptedPolicy(2, [[Resize(3, "test")]]))
    c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.RUNNING
    assert c.num_workers == 2 and c.num_restarts == 0 and group.shutdowns == 0 and c.resizes == []
    assert recorder.history == [{"epoch": 0}]


def test_a_resize_not_in_place_restarts_from_the_checkpoint(recorder):
    group = FakeGroup([running(ckpt_report(0)), finished(n=3)])
    c = make(group, recorder, policy=ScriptedPolicy(2, [[Resize(3, "test", in_place=False)]]))
    c.step(), c.step(), c.step(), c.step()
    assert c.step() is State.RUNNING and group.resizes == [] and group.starts[-1][0] == 3
    assert c.telemetry.watch["fallback"] is None, "a planned checkpoint restart is no fallback"


def test_a_lost_worker_is_a_resize_when_the_policy_says_so(recorder):
    group = FakeGroup([running(ckpt_report(0)), failed("died"), finished(n=1)], resize_outcomes=[ResizeOutcome("in_place")])
    c = make(group, recorder, policy=ScriptedPolicy(2, on_lost=True))
    c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING, "a lost worker in an elastic run is a resize, not a failure"
    assert c.step() is State.RUNNING
    assert group.resizes[0]["num_workers"] == 1 and c.num_failures == 0
    assert c.step() is State.FINISHED


def test_a_silent_worker_is_lost_and_one_that_answers_without_progress_is_a_failure():
    """Issue 57: no answer to a health poll (a partitioned machine, its node not declared dead)
    is a lost worker, as a death is; a worker that answers but made no progress hangs on its
    own, and an error it raised is a failure."""
    from raylight.driver.controller.policies import lost_workers

    silent = WorkerFailure(1, "hang", "did not answer", answered=False)
    stuck = WorkerFailure(0, "hang", "made no progress for 30s")
    dead = WorkerFailure(2, "died", "died: SIGKILL")
    raised = WorkerFailure(0, "error", "raised ValueError: x")
    start = WorkerFailure(-1, "hang", "the group did not start", answered=False)
    assert lost_workers([stuck, silent]) == [silent]
    assert lost_workers([silent, dead, raised]) == [silent, dead]
    assert lost_workers([stuck]) == [] and lost_workers([raised]) == [] and lost_workers([start]) == []


def test_a_silent_worker_in_an_elastic_run_is_a_resize_and_in_a_fixed_one_a_failure(recorder):
    group = FakeGroup([running(ckpt_report(0)), failed("hang", answered=False), finished(n=1)], resize_outcomes=[ResizeOutcome("in_place")])
    c = make(group, recorder, policy=ScriptedPolicy(2, on_lost=True))
    c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING, "a silent worker in an elastic run is lost, not hung"
    assert c.step() is State.RUNNING
    assert group.resizes[0]["num_workers"] == 1 and c.num_failures == 0
    for on_lost, hang in ((False, failed("hang", answered=False)), (True, failed("hang"))):
        other = FakeGroup([running(ckpt_report(0)), hang, finished(n=1)], resize_outcomes=[ResizeOutcome("in_place")])
        c = make(other, recorder, policy=ScriptedPolicy(2, on_lost=on_lost))
        c.step(), c.step(), c.step()
        c.step()
        assert other.resizes == [] and c.num_failures == 1, "fixed size: silent fails; elastic: a hang that answers fails"


def noticed(node="n1", ranks=(1,), n=2, reports=()):
    """A poll in which ``node`` (holding ``ranks``) was given notice."""
    base = running(*reports, n=n)
    return GroupPoll(
        base.polls, notices=[NodeNotice(node, "drain", "test", deadline=None)],
        placement=tuple(WorkerPlace(r, node if r in ranks else "n0", "t") for r in range(n)),
    )


class NoticePolicy(ScriptedPolicy):
    def on_notice(self, num_workers, leaving):
        return Resize(num_workers - len(leaving), "notice", True, leaving, snapshot=True)


def test_a_notice_lets_the_node_s_workers_go_after_a_snapshot(recorder):
    snapshot = Report({}, serialize_state({"epoch": 1}), seq=2, snapshot=True)
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"epoch": 1})), noticed(), noticed(), finished(n=1)],
        resize_outcomes=[ResizeOutcome("in_place", [snapshot])],
    )
    c = make(group, recorder, policy=NoticePolicy(2))
    c.step(), c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.RUNNING
    assert group.resizes[0]["leaving"] == frozenset({1}) and group.resizes[0]["snapshot"]
    assert group.resizes[0]["num_workers"] == 1
    assert recorder.latest.load() == {"epoch": 1}, "the snapshot is the checkpoint restored"
    assert recorder.history == [{"epoch": 0}, {"epoch": 1}], "a snapshot adds no row and rolls nothing back"
    assert c.num_failures == 0 and c.num_preemptions == 1
    assert c.step() is State.RUNNING, "a node is acted on once, however many polls name it"
    assert c.step() is State.FINISHED


def test_a_notice_s_snapshot_is_committed_once_the_workers_stop_before_the_group_re_forms(recorder):
    """The group hands over the reports made while stopping before any worker goes: the
    snapshot is committed then (while the node given notice is still up), not after the
    group has re-formed, and a trace row says when."""
    snapshot = Report({}, serialize_state({"epoch": 1}), seq=2, snapshot=True)
    rows: list[dict] = []
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"epoch": 1})), noticed(), finished(n=1)],
        resize_outcomes=[ResizeOutcome("in_place", [])], stopped_reports=[[snapshot]],
    )
    at_stop: list[object] = []
    group.after_stop = lambda: at_stop.append(recorder.latest.load())
    c = Controller(group=group, recorder=recorder, failure_policy=FailurePolicy(0),
                   scaling_policy=NoticePolicy(2), telemetry=RunTelemetry(trace=rows.append))
    c.step(), c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.RUNNING
    assert at_stop == [{"epoch": 1}], "committed before the group re-formed"
    assert recorder.latest.load() == {"epoch": 1} and recorder.history == [{"epoch": 0}, {"epoch": 1}]
    [row] = [r for r in rows if r.get("event") == "snapshot"]
    assert row["index"] == recorder.latest.metadata["index"] and row["taken"] == snapshot.time
    assert c.step() is State.FINISHED


def test_a_fixed_size_run_whose_loop_stops_on_request_restarts_from_the_notice_s_snapshot(recorder):
    """``raylight run``'s loop stops itself when asked (its agent tells the script): a
    fixed-size run then asks every worker to stop with a snapshot, commits it once they
    have stopped, and restarts from it at its size; without that it trains on."""
    assert FixedScalingPolicy(2, 1).on_notice(2, frozenset({1})) is None
    snapshot = Report({}, serialize_state({"step": 7}), seq=2, snapshot=True)
    group = FakeGroup(
        [running(ckpt_report(0)), running(Report({"step": 6})), noticed(), running(), finished()],
        resize_outcomes=[ResizeOutcome("fallback", [], reason="no live worker left")], stopped_reports=[[snapshot]],
    )
    c = make(group, recorder, policy=FixedScalingPolicy(2, 1, snapshot_on_notice=True))
    c.step(), c.step(), c.step(), c.step()
    assert c.step() is State.RESIZING
    assert c.step() is State.SCHEDULING
    assert group.resizes[0]["leaving"] == frozenset({0, 1}) and group.resizes[0]["snapshot"]
    assert c.step() is State.RUNNING
    assert group.starts[-1][0] == 2 and group.starts[-1][1].load() == {"step": 7}, "restarted from the snapshot"
    assert recorder.history == [{"epoch": 0}, {"step": 6}], "a snapshot adds no row"
    assert c.num_failures == 0 and c.num_preemptions == 1
    c.step()
    assert c.step() is State.FINISHED


def test_a_worker_lost_with_a_noticed_node_is_a_preemption_not_a_failure(recorder):
    died = GroupPoll(
        [WorkerPoll(0, "running")], [WorkerFailure(1, "died", "node gone", node_id="n1")],
        placement=(WorkerPlace(0, "n0", "t"), WorkerPlace(1, "n1", "t")),
    )
    group = FakeGroup([running(ckpt_report(0)), noticed(), died, finished()])
    c = make(group, recorder, max_failures=0)  # fixed size: waits for the node to go
    c.step(), c.step(), c.step()
    assert c.step() is State.RUNNING, "a fixed-size run without step agreement keeps training"
    assert c.step() is State.RESTARTING
    assert c.num_failures == 0 and c.num_preemptions == 1
    c.step(), c.step()
    assert c.step() is State.FINISHED


def test_preemptions_have_their_own_budget(recorder):
    died = GroupPoll(
        [WorkerPoll(0, "running")], [WorkerFailure(1, "died", "node gone", node_id="n1")],
        placement=(WorkerPlace(0, "n0", "t"), WorkerPlace(1, "n1", "t")),
    )
    group = FakeGroup([running(ckpt_report(0)), noticed(), died])
    c = Controller(
        group=group, recorder=recorder, failure_policy=FailurePolicy(5, max_preemptions=0),
        scaling_policy=FixedScalingPolicy(2, 1),
    )
    for _ in range(5):
        c.step()
    assert c.state is State.ERRORED and isinstance(c.error, PreemptedError)
    assert "max_preemptions=0" in str(c.error)


def test_the_start_runs_what_the_cluster_places(recorder):
    """The start size comes from a view of free resources that can be stale: the group
    places what it can, down to the policy's fewest, and the run starts at that size."""
    group = FakeGroup([running(n=2), finished(n=2)], placeable=2)
    c = make(group, recorder, policy=ScriptedPolicy(3, fewest=1, threads=lambda k: 6 // k))
    c.step()
    assert c.step() is State.RUNNING
    assert group.reserves == [(3, 1)] and group.starts[-1][0] == 2
    assert c.num_workers == 2 and c.threads == 3


def test_the_start_fails_when_not_even_the_fewest_fit(recorder):
    group = FakeGroup([], placeable=1)
    c = make(group, recorder, policy=ScriptedPolicy(3, fewest=2))
    c.step()
    assert c.step() is State.ERRORED and group.starts == []
    assert isinstance(c.error, InsufficientResourcesError)


def test_fixed_size_start_reserves_nothing_first(recorder):
    group = FakeGroup([running(), finished()])
    c = make(group, recorder)
    c.step(), c.step()
    assert group.reserves == [] and group.starts[0][0] == 2


def test_restart_size_comes_from_the_policy(recorder):
    group = FakeGroup([failed("died"), finished(n=1)])
    c = make(group, recorder, max_failures=1, policy=ScriptedPolicy(2, restart=1))
    c.run()
    assert [n for n, _ in group.starts] == [2, 1]


def test_scaling_decisions_are_executed_in_order(recorder):
    plan = BatchPlan(16, 1, 1)
    group = FakeGroup([running(), running(), finished()])
    requested = []
    group.request_resources = requested.append
    policy = ScriptedPolicy(2, [[SetPlan(plan, "goodput"), RequestResources(4)], [Resize(2, "already this size")]])
    c = make(group, recorder, policy=policy)
    c.step(), c.step(), c.step()
    assert group.plans == [plan] and requested == [4]
    assert c.step() is State.RUNNING, "a resize to the current size is no resize"
    assert c.step() is State.FINISHED and policy.observed == 3


def test_an_autoscaler_request_the_cluster_does_not_take_in_time_leaves_the_run_going(recorder, caplog):
    group = FakeGroup([running(), running(), finished()])

    def slow(num_workers):
        raise TimeoutError("the cluster did not take the request ... FailureConfig.connect_timeout_s=15s")

    group.request_resources = slow
    policy = ScriptedPolicy(2, [[RequestResources(4)]])
    c = make(group, recorder, policy=policy)
    with caplog.at_level("WARNING", logger="raylight"):
        states = [c.step() for _ in range(5)]
    assert states[-1] is State.FINISHED, states
    assert any("connect_timeout_s" in r.message and "goes on with 2 worker(s)" in r.message for r in caplog.records)


def test_no_decisions_until_a_resize_has_settled(recorder):
    """After a resize the policy is not asked again until the first step after it; the
    time to that step is handed to the policy as the resize's cost."""
    from raylight.worker.protocol import Progress

    first = GroupPoll([WorkerPoll(0, "running", progress=Progress(batches_since_start=1, first_batch_wall=None)), WorkerPoll(1, "running")])
    group = FakeGroup([running(ckpt_report(0)), running(n=3), first, finished(n=3)], resize_outcomes=[ResizeOutcome("in_place")])
    policy = ScriptedPolicy(2, [[Resize(3, "grow")], [SetPlan(BatchPlan(4), "x")], [SetPlan(BatchPlan(8), "y")]])
    c = make(group, recorder, policy=policy)
    c.step(), c.step(), c.step(), c.step()  # init, schedule, poll (decides), resize
    c.step()  # a poll with no first step yet: no decision
    assert group.plans == [] and c.telemetry.awaiting_first_step
    c.step()  # the first step: the resize is timed and decisions resume
    assert len(policy.restart_costs) == 1 and group.plans == [BatchPlan(4)]
    assert c.resizes[0]["from"] == 2 and c.resizes[0]["to"] == 3


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


def test_trace_rows_report_the_samples_per_second_since_the_previous_row():
    """Each row's throughput covers the same interval as its measured step time, not the
    display's 5 s window, which would lag a batch change by 5 s."""
    from raylight.worker.protocol import Progress

    def at(samples):  # both workers at ``samples`` each
        return GroupPoll([WorkerPoll(r, "running", progress=Progress(samples=samples)) for r in range(2)])

    clock, rows = Clock(), []
    telemetry = RunTelemetry(trace=rows.append, clock=clock)
    # 100 samples/s in all for 10 s, then 1,000 samples/s; a row every 2 s.
    polls = [at(0), *(at(50 * t) for t in range(1, 11)), *(at(500 + 500 * t) for t in range(1, 6))]
    for t, poll in enumerate(polls):
        clock.now = float(t)
        telemetry.observe(poll, 2)
        if t and t % 2 == 0:
            telemetry.trace_row({"t": t})
    rates = [row["throughput"] for row in rows]
    assert [row["t"] for row in rows] == [2, 4, 6, 8, 10, 12, 14]
    assert rates[1:] == [pytest.approx(100.0)] * 4 + [pytest.approx(1000.0)] * 2  # the new rate at once


# -- the same error twice before any report is final at once ------------------------------
# Not one of the errors in the code that stop a run at once (DETERMINISTIC_ERRORS): a
# ValueError may depend on the data or the state, so the first failure gets its restart.
NAME_ERROR = ErrorInfo(
    "ValueError", "bad value for modle",
    'Traceback (most recent call last):\n  File "/x/raylight/worker/context.py", line 9, in run\n'
    '  File "/home/u/train.py", line 12, in loop\n    modle(x)\nValueError: bad value for modle',
)


def test_the_failure_policy_stops_at_the_same_error_twice_before_any_report():
    """Pure decision: same type, message and innermost frame (any rank) before progress,
    twice in a row: Raise(repeated), whatever max_failures still allows; a different
    error, a death or a hang, or a first failure after progress: the usual budget. Under
    max_failures=-1 (restarts without limit, asked for) it backs off instead."""
    policy = FailurePolicy(3)
    first = WorkerFailure(0, "error", "raised ValueError", error=NAME_ERROR)
    again = WorkerFailure(1, "error", "raised ValueError", error=NAME_ERROR)  # another rank, the same error
    assert isinstance(policy.decide(first, num_failures=1), Restart)
    decision = policy.decide(again, num_failures=2, before_progress=first)
    assert isinstance(decision, Raise) and decision.repeated
    elsewhere = ErrorInfo("ValueError", NAME_ERROR.message, NAME_ERROR.traceback.replace("line 12", "line 40"))
    other = WorkerFailure(0, "error", "raised ValueError", error=elsewhere)
    assert isinstance(policy.decide(other, num_failures=2, before_progress=first), Restart)
    died = WorkerFailure(0, "died", "died (exit code -9)")
    assert isinstance(policy.decide(died, num_failures=2, before_progress=died), Restart)
    assert isinstance(policy.decide(again, num_failures=2), Restart)  # the previous attempt had reported
    assert isinstance(FailurePolicy(-1).decide(again, num_failures=9, before_progress=first), Restart)
    assert not policy.decide(again, num_failures=4, before_progress=None).repeated  # out of restarts: the usual Raise


def test_the_same_error_before_any_report_ends_the_run_on_the_second_attempt_without_restart_advice(recorder, caplog):
    import logging

    fails = GroupPoll([WorkerPoll(0, "running")], [WorkerFailure(0, "error", "raised ValueError: bad value for modle", error=NAME_ERROR)])
    group = FakeGroup([fails, fails, finished()])
    c = make(group, recorder, max_failures=3)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        c.run()
    assert c.state is State.ERRORED and len(group.starts) == 2 and c.num_failures == 2
    text = str(c.error)
    assert isinstance(c.error, WorkerError) and "modle(x)" in text and "train.py\", line 12" in text
    assert "the same way on 2 attempts in a row, each before its first report" in text
    assert "raise FailureConfig" not in text and "automatically" not in text, text  # no advice to allow more restarts
    restarts = [r.getMessage() for r in caplog.records if "restarting from" in r.getMessage()]
    assert len(restarts) == 1 and "restarting from the beginning (no checkpoint yet)" in restarts[0]


def test_a_report_between_two_equal_errors_keeps_the_restart_budget(recorder, caplog, tmp_path):
    import logging

    fails = GroupPoll([WorkerPoll(0, "running")], [WorkerFailure(0, "error", "raised ValueError", error=NAME_ERROR)])
    group = FakeGroup([running(ckpt_report(0)), fails, fails, fails, finished()])
    c = make(group, recorder, max_failures=5)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        c.run()
    # attempt 1 reported then failed; attempt 2 failed before a report (not yet twice);
    # attempt 3 failed the same way before a report: stop. Never the first two in a row.
    assert c.state is State.ERRORED and c.num_failures == 3 and len(group.starts) == 3
    assert "restarting from checkpoint 0" in caplog.text

    other = RunRecorder(RunStorage(str(tmp_path / "other")), checkpoints_to_keep=2)
    other.open({}, resume=False)
    group = FakeGroup([fails, running(ckpt_report(0)), fails, running(ckpt_report(1)), finished()])
    c = make(group, other, max_failures=5)
    c.run()
    assert c.state is State.FINISHED and c.num_failures == 2


# -- an error in the code before the first step is final at once ---------------------------
def code_error(exc_type="NameError", message="name 'dataset' is not defined", line=8):
    return ErrorInfo(
        exc_type, message,
        'Traceback (most recent call last):\n  File "/x/raylight/worker/context.py", line 647, in call_train_loop\n'
        f'  File "/home/u/quick.py", line {line}, in train_loop\n    ctx.prepare_loader(dataset)\n{exc_type}: {message}',
    )


def code_failures(*errors, steps=0):
    """One poll in which rank i raised errors[i] after ``steps`` batches."""
    from raylight.worker.protocol import Progress

    polls = [WorkerPoll(r, "errored", progress=Progress(batches_since_start=steps), error=e) for r, e in enumerate(errors)]
    return GroupPoll(polls, [WorkerFailure(r, "error", f"raised {e.exc_type}: {e.message}", error=e) for r, e in enumerate(errors)])


def test_an_error_in_the_code_is_deterministic_only_before_the_first_step_and_the_same_on_every_failed_rank():
    from raylight.driver.controller.policies import DETERMINISTIC_ERRORS, deterministic_error

    kinds = ("NameError", "TypeError", "AttributeError", "ImportError", "ModuleNotFoundError", "SyntaxError")
    for kind in (*kinds, "raylight.base.exceptions.ConfigError"):  # a worker's ConfigError: the model's settings
        assert kind in DETERMINISTIC_ERRORS
        poll = code_failures(code_error(kind, "x"), code_error(kind, "x"))
        assert deterministic_error(poll.failures, steps=0, reports=0), kind
        assert deterministic_error(poll.failures, steps=1, reports=0), f"{kind} at the first step"
        assert not deterministic_error(poll.failures, steps=2, reports=0), f"{kind} after the first step"
        assert not deterministic_error(poll.failures, steps=0, reports=1), f"{kind} after a report"
    one = code_failures(code_error()).failures
    assert deterministic_error(one, steps=0, reports=0), "the one rank that failed so far"
    assert not deterministic_error(code_failures(code_error("ValueError", "bad")).failures, steps=0, reports=0)
    assert not deterministic_error(code_failures(code_error("RuntimeError", "gloo")).failures, steps=0, reports=0)
    assert not deterministic_error(code_failures(code_error(), code_error(line=9)).failures, steps=0, reports=0), "ranks differ"
    assert not deterministic_error(code_failures(code_error(), code_error("TypeError", "x")).failures, steps=0, reports=0)
    died = [*one, WorkerFailure(1, "died", "died (exit code -9)")]
    assert not deterministic_error(died, steps=0, reports=0), "a death may be the cause"
    assert not deterministic_error([WorkerFailure(-1, "error", "start failed")], steps=0, reports=0)
    assert not deterministic_error([], steps=0, reports=0)


def test_the_failure_policy_raises_a_deterministic_error_at_once_whatever_the_budget():
    failure = code_failures(code_error()).failures[0]
    for budget in (0, 3, -1):
        decision = FailurePolicy(budget).decide(failure, num_failures=1, deterministic=True)
        assert isinstance(decision, Raise) and decision.deterministic and not decision.repeated, budget
    assert isinstance(FailurePolicy(3).decide(failure, num_failures=1), Restart), "otherwise the usual budget"


def test_a_name_error_before_the_first_step_ends_the_run_at_once_saying_why(recorder, caplog):
    """The README's quick start with its dataset undefined: one attempt, no "restarting"
    line, an error naming the rule and the fix, no advice to raise max_failures."""
    import logging

    group = FakeGroup([code_failures(code_error(), code_error()), finished()])
    c = make(group, recorder, max_failures=2)
    with caplog.at_level(logging.WARNING, logger="raylight"):
        c.run()
    assert c.state is State.ERRORED and len(group.starts) == 1 and c.num_failures == 1
    text = str(c.error)
    assert isinstance(c.error, WorkerError) and c.error.exc_type == "NameError"
    assert "NameError raised by the training loop before its first step" in text
    assert "stops without retrying (max_failures=2 does not apply to it)" in text
    assert "fix the error in the traceback below" in text and "quick.py\", line 8" in text
    assert "raise FailureConfig" not in text and "checkpoint" not in text, text
    assert "restarting" not in caplog.text


def test_the_same_name_error_after_the_first_step_keeps_the_restart_budget(recorder):
    group = FakeGroup([code_failures(code_error(), code_error(), steps=3), finished()])
    c = make(group, recorder, max_failures=2)
    c.run()
    assert c.state is State.FINISHED and c.num_failures == 1 and len(group.starts) == 2


def test_the_advice_to_raise_max_failures_names_where_a_restart_would_begin(recorder, tmp_path):
    """Out of restarts: the advice says a restart begins from the beginning when the run
    has no checkpoint, never "from the last checkpoint"; with one, it names it."""
    c = make(FakeGroup([failed("died")]), recorder)
    c.run()
    text = str(c.error)
    assert "raise FailureConfig.max_failures (fit(max_failures=...)) to restart automatically" in text
    assert "(from the beginning: the run has no checkpoint yet)" in text and "last checkpoint" not in text, text
    other = RunRecorder(RunStorage(str(tmp_path / "other")), checkpoints_to_keep=2)
    other.open({}, resume=False)
    c = make(FakeGroup([running(ckpt_report(0)), failed("died")]), other)
    c.run()
    assert "to restart automatically from checkpoint 0." in str(c.error), str(c.error)

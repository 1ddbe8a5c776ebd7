"""The driver-side control plane: an explicit state machine over a worker group.

States and transitions (one ``step()`` each)::

    INITIALIZING -> SCHEDULING -> RUNNING -> FINISHED
                        ^            |
                        |            +-- failure, policy says restart --> RESTARTING
                        +---------------------------------------------------+
                        |            +-- Resize decision, or a lost worker
                        |            |   in an elastic run ---------------> RESIZING
                        |            |       in place: survivors keep running -> RUNNING
                        +----------------    no live state: from checkpoint --> SCHEDULING
                                     +-- failure, policy says raise ------> ERRORED

The controller decides nothing itself: the scaling policy chooses every size, thread
count, batch plan and resource request (``policies.ScalingPolicy``), the failure policy
what a failure means, and the controller executes their decisions (``decisions``). A
pending decision rides in the phase (``Phase.resize``, ``Phase.delay_s``), never in side
fields. Reports are recorded before failures are judged, so a checkpoint reported just
before a crash is committed and used by the restart. The controller never imports torch
or Ray: it sees ``GroupPoll`` data.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raylight.base.clock import monotonic, wall
from raylight.base.exceptions import (
    ConfigError,
    InsufficientResourcesError,
    PreemptedError,
    RaylightError,
    TrainingFailedError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerImportError,
    WorkerStartError,
)
from raylight.driver.controller.cluster_share import ADMIT_POLL_S, ClusterShare
from raylight.driver.controller.decisions import (
    Raise,
    RequestResources,
    Resize,
    ScalingDecision,
    SetPlan,
)
from raylight.driver.controller.policies import (
    FailurePolicy,
    ScalingPolicy,
    ScalingView,
    deterministic_error,
    lost_workers,
)
from raylight.driver.controller.telemetry import RunTelemetry
from raylight.driver.recorder import RunRecorder
from raylight.worker.protocol import (
    GroupPoll,
    Report,
    ResizeOutcome,
    WorkerFailure,
    WorkerGroup,
)

log = logging.getLogger("raylight")


class State(enum.Enum):
    INITIALIZING = "initializing"
    SCHEDULING = "scheduling"
    RUNNING = "running"
    RESTARTING = "restarting"
    RESIZING = "resizing"
    FINISHED = "finished"
    ERRORED = "errored"

    @property
    def terminal(self) -> bool:
        return self in (State.FINISHED, State.ERRORED)


@dataclass(frozen=True)
class Phase:
    """Where the controller is, with what it is about to do there."""

    state: State
    resize: Resize | None = None  # RESIZING: the resize to execute
    delay_s: float = 0.0  # RESTARTING: the back-off before it
    decided_at: float = 0.0  # RESIZING: when it was decided (monotonic, wall)
    decided_wall: float = 0.0


class Controller:
    def __init__(
        self,
        *,
        group: WorkerGroup,
        recorder: RunRecorder,
        failure_policy: FailurePolicy,
        scaling_policy: ScalingPolicy,
        telemetry: RunTelemetry | None = None,
        poll_interval_s: float = 0.2,
        clock: Callable[[], float] = monotonic,
        sleep: Callable[[float], Any] | None = None,
        share: ClusterShare | None = None,
    ) -> None:
        self.group = group
        self.share = share  # the run's part in the cluster's scheduler, where one runs
        self.waiting = ""  # why the scheduler has not given the run its size yet
        self.recorder = recorder
        self.failure_policy = failure_policy
        self.scaling_policy = scaling_policy
        self.telemetry = telemetry or RunTelemetry(clock=clock)
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait  # interruptible by Ctrl-C
        self.phase = Phase(State.INITIALIZING)
        self.num_workers = 0  # of the group running (or about to)
        self.threads = 1
        self.num_failures = 0
        self.num_preemptions = 0
        self.rendezvous_retries = 0  # groups formed again after a worker failed to join
        self.num_restarts = 0
        self._noticed: set[str] = set()  # nodes given notice (acted on once each)
        self.error: RaylightError | None = None
        self.last_failure: WorkerFailure | None = None
        self._last_seq = -1  # of the last report recorded
        self._shadow: list[Report] = []  # other ranks' copies of reports not yet recorded
        # Failures in a row with no new checkpoint, and whether they were the same.
        self._in_a_row = 0
        self._failed_at: int | None = None  # the last checkpoint when it last failed
        self._same = 0
        self._last_message = ""
        # Reports recorded since the group last started, and the failure of the attempt
        # before it when that attempt had none (the failure policy's same-error rule).
        self._attempt_reports = 0
        self._unprogressed: WorkerFailure | None = None

    @property
    def state(self) -> State:
        return self.phase.state

    @property
    def resizes(self) -> list[dict[str, Any]]:
        return self.telemetry.resizes

    def _view(self, poll: GroupPoll) -> ScalingView:
        return ScalingView(self.clock(), self.num_workers, self.threads, poll, self.group.capacity)

    # -- stepping -----------------------------------------------------------------
    def step(self) -> State:
        handler = {
            State.INITIALIZING: self._initialize,
            State.SCHEDULING: self._schedule,
            State.RUNNING: self._poll,
            State.RESTARTING: self._restart,
            State.RESIZING: self._resize,
        }.get(self.state)
        if handler is not None:
            handler()
        return self.state

    def run(self) -> None:
        """Step until FINISHED or ERRORED, pacing polls by ``poll_interval_s``."""
        try:
            while not self.state.terminal:
                if self.step() is State.RUNNING:
                    self._stop.wait(self.poll_interval_s)
        finally:
            self.group.shutdown()
            if self.share is not None:
                self.share.close()

    def _initialize(self) -> None:
        if self.share is not None:
            waiting = self.share.admit(self.clock(), self.group.capacity)
            if waiting:  # the scheduler gives the slots to runs that came first
                if waiting != self.waiting:
                    log.warning("%s (the raylight scheduler starts this run when they are free)", waiting)
                self.waiting = waiting
                self.sleep(ADMIT_POLL_S)
                return
            self.waiting = ""
        self.num_workers = self.scaling_policy.start_size(self.group.capacity)
        self.threads = self.scaling_policy.threads(self.num_workers)
        self.phase = Phase(State.SCHEDULING)

    def _schedule(self) -> None:
        policy = self.scaling_policy
        try:
            at_least = policy.fewest(self.num_workers)
            if at_least < self.num_workers:  # what the cluster places now
                placed = self.group.reserve(self.num_workers, at_least=at_least)
                if placed != self.num_workers:
                    log.warning("starting %d of %d workers: the cluster placed no more now", placed, self.num_workers)
                    self.num_workers, self.threads = placed, policy.threads(placed)
        except InsufficientResourcesError as exc:
            self._fail(exc)
            return
        try:
            self.group.start(
                num_workers=self.num_workers,
                checkpoint=self.recorder.latest,
                threads=self.threads,
                plan=policy.plan(self.num_workers),
                target=self.recorder.checkpoint_target(),
            )
        except (InsufficientResourcesError, WorkerImportError, ConfigError) as exc:  # a restart would fail the same way
            self._fail(exc)
            return
        except WorkerStartError as exc:
            self._handle_failure(WorkerFailure(rank=-1, kind="error", message=str(exc)), cause=exc)
            return
        try:
            self.recorder.begin()  # the run directory appears now that training starts
        except RaylightError as exc:
            self._fail(exc)
            return
        policy.started(self.num_workers)
        self._attempt_reports = 0
        self.phase = Phase(State.RUNNING)

    def _poll(self) -> None:
        poll = self.group.poll()
        self._record(poll)
        if self.telemetry.on_poll is not None:
            self.telemetry.on_poll(poll, self)
        if self._on_notices(poll):
            return
        if poll.failures:
            died = lost_workers(poll.failures)  # dead, or silent (a partition)
            lost = self.scaling_policy.on_lost(self.num_workers, len(died)) if died else None
            if lost is not None:
                log.warning("lost %d worker(s) (%s); continuing elastically", len(died), died[0].message)
                self._begin_resize(lost)
                return
            self._handle_failure(poll.failures[0], poll=poll)
            return
        if poll.finished:
            self.scaling_policy.finish(self._view(poll))
            self.phase = Phase(State.FINISHED)
            self.group.shutdown()
            return
        if self.telemetry.awaiting_first_step:  # no decisions until a resize has settled
            return
        for decision in self.scaling_policy.decide(self._view(poll)):
            self._execute(decision)
        if self.share is not None:
            self.share.tick(self.clock(), [p.node_id for p in sorted(poll.placement, key=lambda p: p.rank)])

    def _on_notices(self, poll: GroupPoll) -> bool:
        """Nodes given notice (a drain, a SIGTERM, a cloud's notice): once per node, the
        scaling policy's resize lets their workers go after a snapshot. Returns whether
        a resize begins."""
        fresh = [n for n in poll.notices if n.node_id not in self._noticed]
        if not fresh:
            return False
        self._noticed.update(n.node_id for n in fresh)
        leaving = frozenset(r for n in fresh for r in poll.ranks_on.get(n.node_id, []))
        now = wall()
        for n in fresh:
            left = f"{n.deadline - now:.0f}s left" if n.deadline is not None else "no deadline given"
            log.warning("node %s was given notice (%s: %s; %s)", n.node_id[:12], n.source, n.reason, left)
            self.telemetry.event({
                "event": "notice", "node": n.node_id, "source": n.source, "reason": n.reason,
                "deadline": n.deadline, "time": now, "ranks": sorted(poll.ranks_on.get(n.node_id, [])),
            })
        if not leaving or any(f.kind == "died" for f in poll.failures):
            return False  # gone already: a lost worker, below
        decision = self.scaling_policy.on_notice(self.num_workers, leaving)
        if decision is None:
            return False
        self.num_preemptions += 1
        self._begin_resize(decision)
        return True

    def _execute(self, decision: ScalingDecision) -> None:
        if isinstance(decision, SetPlan):
            self.group.set_plan(decision.plan)
        elif isinstance(decision, RequestResources):
            try:
                self.group.request_resources(decision.num_workers)
            except TimeoutError as exc:  # training goes on at its size; the policy may ask again
                log.warning("%s; training goes on with %d worker(s)", exc, self.num_workers)
                return
            log.info("asked the autoscaler for %d worker(s): %s", decision.num_workers, decision.reason)
            self.telemetry.event({"event": "autoscale_request", "workers": decision.num_workers, "reason": decision.reason})
        elif isinstance(decision, Resize) and decision.num_workers != self.num_workers:
            self._begin_resize(decision)

    def _record(self, poll: GroupPoll) -> None:
        for report in poll.reports:
            self.recorder.record(report, num_workers=self.num_workers)
            self._last_seq = max(self._last_seq, report.seq)
            self._attempt_reports += 1
        self._shadow = [r for r in (*self._shadow, *poll.shadow_reports) if r.seq > self._last_seq]
        first_step_s = self.telemetry.observe(poll, self.num_workers)
        if first_step_s is not None:
            self.scaling_policy.record_restart(first_step_s)
        self.scaling_policy.observe(poll)

    # -- resizing -----------------------------------------------------------------
    def _begin_resize(self, decision: Resize) -> None:
        self.phase = Phase(State.RESIZING, resize=decision, decided_at=self.clock(), decided_wall=wall())

    def _resize(self) -> None:
        phase = self.phase
        assert phase.resize is not None
        target, reason = phase.resize.num_workers, phase.resize.reason
        old = self.num_workers
        threads = self.scaling_policy.threads(target)
        plan = self.scaling_policy.plan(target)
        latest = self.recorder.latest
        commit = int(latest.metadata.get("index", -1)) if latest is not None else -1

        def record(reports: list[Report]) -> None:
            for report in reports:
                self.recorder.record(report, num_workers=old)
                self._last_seq = max(self._last_seq, report.seq)
                self._attempt_reports += 1
                if report.snapshot and report.checkpoint is not None:
                    self._snapshot_committed(report)

        if phase.resize.in_place:
            # The reports made while stopping (a notice's snapshot among them) are
            # committed as soon as every worker has stopped: before the workers of a node
            # given notice go and before the group re-forms, either of which can outlast
            # the node.
            outcome = self.group.resize(
                num_workers=target, threads=threads, plan=plan, commit=commit,
                target=self.recorder.checkpoint_target(clear=False),
                leaving=phase.resize.leaving, snapshot=phase.resize.snapshot, on_stopped=record,
            )
        else:
            outcome = ResizeOutcome("fallback", reason="this run resizes from its checkpoints")
        record(outcome.reports)
        self._recover_lost_reports([*self._shadow, *outcome.shadow], outcome.adopted, num_workers=old)
        if outcome.kind in ("finished", "unchanged"):
            if outcome.kind == "unchanged":
                log.info("no worker could be added now (%s); %d go on, and the run asks again", outcome.reason, old)
            self.phase = Phase(State.RUNNING)  # the next poll sees it finished
            return
        latest = self.recorder.latest
        self.recorder.rollback()
        self.num_restarts += 1
        self.threads = threads
        kind = "in_place"
        if outcome.kind == "fallback":
            if phase.resize.in_place:
                index = latest.metadata.get("index") if latest is not None else None
                where = f"checkpoint {index}" if latest is not None else "the beginning (no checkpoint yet)"
                if phase.resize.snapshot and len(phase.resize.leaving) >= old:  # no worker was to stay
                    log.info("every worker stopped for the notice; restarting from %s", where)
                else:
                    log.warning("resizing in place failed (%s); restarting from %s", outcome.reason, where)
            self.group.shutdown()
            self.num_workers = target
            self.phase = Phase(State.SCHEDULING)
            kind = "checkpoint"
        else:
            self.num_workers = self.group.num_workers
            self.scaling_policy.started(self.num_workers)
            self.phase = Phase(State.RUNNING)
        log.info("resized %d -> %d workers (%s): %s", old, self.num_workers if kind == "in_place" else target, kind, reason)
        self.telemetry.resized({
            "kind": kind,
            "from": old,
            "to": self.num_workers,  # an in-place resize may keep fewer than it aimed for
            "reason": reason,
            # Why a resize meant to keep the live workers restarted from a checkpoint instead.
            "fallback": outcome.reason if kind == "checkpoint" and phase.resize.in_place else None,
            "decided_at": phase.decided_at,
            "restored_checkpoint": None if latest is None else latest.metadata.get("index"),
            "stopped_at": outcome.stopped_at if outcome.stopped_at is not None else phase.decided_at,
            "phases": {k: round(v, 4) for k, v in outcome.phases.items()},
            "decided_wall": phase.decided_wall,
            "stopped_wall": outcome.stopped_wall if outcome.stopped_wall is not None else phase.decided_wall,
        })

    def _snapshot_committed(self, report: Report) -> None:
        """A preemption's just-in-time checkpoint is committed: a ``snapshot`` trace row."""
        latest = self.recorder.latest
        self.telemetry.event({
            "event": "snapshot", "time": wall(), "taken": report.time,
            "index": None if latest is None else latest.metadata.get("index"),
        })

    def _recover_lost_reports(
        self, shadow: list[Any], adopted: tuple[int, bytes, int] | None, *, num_workers: int
    ) -> None:
        """Record the reports rank 0 made but never delivered (it died), from another
        rank's copies, with the newest checkpoint a survivor holds."""
        by_seq = {r.seq: r for r in shadow if r.seq > self._last_seq}
        if adopted is not None and adopted[2] > self._last_seq and adopted[2] not in by_seq:
            by_seq[adopted[2]] = Report({}, None, 0.0, adopted[2])  # its metrics died too
        for seq in sorted(by_seq):
            copy = by_seq[seq]
            if adopted is not None and seq == adopted[2]:
                report = Report(copy.metrics, adopted[1], copy.time, seq, snapshot=copy.snapshot)
                self.recorder.record(report, num_workers=num_workers, commit_index=adopted[0])
            elif copy.snapshot:  # a snapshot's copy has no row of its own
                pass
            else:
                self.recorder.record(Report(copy.metrics, None, copy.time, seq), num_workers=num_workers)
            self._last_seq = seq
        self._shadow = []

    # -- failures -----------------------------------------------------------------
    def _restart(self) -> None:
        self.group.shutdown()
        self.recorder.rollback()
        if self.phase.delay_s > 0:  # resources are free while it waits
            self.sleep(self.phase.delay_s)
        self.num_restarts += 1
        self.num_workers = self.scaling_policy.restart_size(self.num_workers)
        self.threads = self.scaling_policy.threads(self.num_workers)
        self.phase = Phase(State.SCHEDULING)

    def _handle_failure(
        self, failure: WorkerFailure, cause: BaseException | None = None, *, poll: GroupPoll | None = None,
    ) -> None:
        if failure.kind == "died" and failure.node_id is not None and failure.node_id in self._noticed:
            self._handle_preemption(failure, cause)
            return
        if self.failure_policy.retries_rendezvous(failure, retried=self.rendezvous_retries):
            self.rendezvous_retries += 1
            log.warning(
                "worker rank %s could not join the process group (%s); forming it again "
                "(retry %d of FailureConfig.rendezvous_retries=%d, not counted against max_failures)",
                failure.rank, failure.message, self.rendezvous_retries, self.failure_policy.rendezvous_retries,
            )
            self.phase = Phase(State.RESTARTING)
            return
        self.num_failures += 1
        self.last_failure = failure
        resume = self.recorder.latest
        commit = int(resume.metadata.get("index", -1)) if resume is not None else -1
        self._in_a_row = self._in_a_row + 1 if commit == self._failed_at else 1
        self._failed_at = commit
        self._same = self._same + 1 if failure.message == self._last_message and self._in_a_row > 1 else 1
        self._last_message = failure.message
        progressed = self._attempt_reports > 0
        steps = max((p.progress.batches_since_start for p in poll.polls), default=0) if poll else 0
        decision = self.failure_policy.decide(
            failure, num_failures=self.num_failures, in_a_row=self._in_a_row,
            before_progress=None if progressed else self._unprogressed,
            deterministic=poll is not None and deterministic_error(poll.failures, steps=steps, reports=self._attempt_reports),
        )
        self._unprogressed = None if progressed else failure
        if isinstance(decision, Raise):
            error = self._error_for(failure, repeated=decision.repeated, deterministic=decision.deterministic)
            self._fail(error, cause=cause)
            return
        where = f"checkpoint {resume.metadata.get('index')}" if resume else "the beginning (no checkpoint yet)"
        budget = self.failure_policy.max_failures
        wait = ""
        if decision.delay_s > 0:
            same = ", the same failure each time" if self._same == self._in_a_row else ""
            wait = (
                f" in {decision.delay_s:g}s: {self._in_a_row} failures in a row with no new "
                f"checkpoint{same}; the wait doubles with each, up to "
                f"FailureConfig.restart_backoff_max_s={self.failure_policy.backoff_max_s:g}s"
            )
        log.warning(
            "%s; restarting from %s%s (failure %d, max_failures=%s)",
            failure.described(),
            where,
            wait,
            self.num_failures,
            f"{budget} (without limit)" if budget < 0 else budget,
        )
        self.phase = Phase(State.RESTARTING, delay_s=decision.delay_s)

    def _handle_preemption(self, failure: WorkerFailure, cause: BaseException | None) -> None:
        """A worker lost with a node that was given notice: counted against
        ``max_preemptions``, not ``max_failures``; restarted at once."""
        self.num_preemptions += 1
        self.last_failure = failure
        decision = self.failure_policy.decide_preemption(failure, num_preemptions=self.num_preemptions)
        if isinstance(decision, Raise):
            where = f" (node {failure.node}, pid {failure.pid})" if failure.node else ""
            self._fail(PreemptedError(
                f"worker rank {failure.rank}{where} {failure.message}, with its preempted node. "
                f"The run lost nodes to preemption {self.num_preemptions} time(s) and "
                f"FailureConfig.max_preemptions={self.failure_policy.max_preemptions} allows no more; "
                "raise it (-1: no limit), or resubmit (raylight submit --retries resumes the run).",
                rank=failure.rank, node=failure.node, reason=failure.message, num_failures=self.num_failures,
            ), cause=cause)
            return
        resume = self.recorder.latest
        where = f"checkpoint {resume.metadata.get('index')}" if resume else "the beginning"
        log.warning(
            "worker rank %s went with its preempted node; restarting from %s (preemption %d, "
            "not counted against max_failures)", failure.rank, where, self.num_preemptions,
        )
        self.phase = Phase(State.RESTARTING)

    def _fail(self, error: RaylightError, cause: BaseException | None = None) -> None:
        if cause is not None and error.__cause__ is None:
            error.__cause__ = cause
        self.error = error
        self.phase = Phase(State.ERRORED)
        self.group.shutdown()

    def _error_for(self, failure: WorkerFailure, *, repeated: bool = False, deterministic: bool = False) -> TrainingFailedError:
        budget = self.failure_policy.max_failures
        setting = self.failure_policy.setting
        head = f"{failure.described(where=True)}."
        latest = self.recorder.latest
        where = f"from checkpoint {latest.metadata.get('index')}" if latest is not None else "(from the beginning: the run has no checkpoint yet)"
        tail = (
            f" The run failed {self.num_failures} time(s) and {setting}={budget} allows "
            f"{budget} restart(s); raise {self.failure_policy.advice} "
            f"to restart automatically {where}."
        )
        if deterministic:  # no restart can help: say which rule stopped it, and why
            kind = failure.error.exc_type if failure.error is not None else "the error"
            tail = (
                f" {kind} raised by the training loop before its first step, the same on every "
                "rank that failed, is an error in the code: a restart runs the same code and "
                f"raises it again, so the run stops without retrying ({setting}={budget} does "
                "not apply to it); fix the error in the traceback below."
            )
        elif repeated:  # more restarts would not help: no advice to allow them
            tail = (
                f" It failed the same way on {self.num_failures} attempts in a row, each before "
                f"its first report, so the run stops now rather than retry ({setting}={budget} "
                "is not the limit here: a restart would fail again); fix the error in the "
                "traceback below."
            )
        common: dict[str, Any] = {
            "rank": failure.known_rank,
            "node": failure.node,
            "reason": failure.message,
            "num_failures": self.num_failures,
        }
        if failure.kind == "died":
            return WorkerDiedError(head + tail, **common)
        if failure.kind == "hang":
            hint = (
                " If the worker is only slow, raise FailureConfig.hang_timeout_s, or call "
                "ctx.heartbeat() inside long steps."
            )
            return WorkerHangError(head + hint + tail, **common)
        info = failure.error
        if info is None:
            return TrainingFailedError(head + tail, **common)
        err = WorkerError(
            f"{head}{tail}\n\nTraceback from worker rank {failure.rank}:\n{info.traceback}",
            exc_type=info.exc_type,
            exc_message=info.message,
            worker_traceback=info.traceback,
            **common,
        )
        if failure.cause is not None:  # fetched by the group through Ray, never unpickled here
            err.__cause__ = failure.cause
        return err

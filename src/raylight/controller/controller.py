"""The driver-side control plane: an explicit state machine over a worker group.

States and transitions (one ``step()`` each)::

    INITIALIZING -> SCHEDULING -> RUNNING -> FINISHED
                        ^            |
                        |            +-- failure, policy says restart --> RESTARTING
                        +---------------------------------------------------+
                        |            +-- resize decision, or a lost worker
                        |            |   in an elastic run ---------------> RESIZING
                        |            |       in place: survivors keep running -> RUNNING
                        +----------------    no live state: from checkpoint --> RESTARTING
                                     +-- failure, policy says raise ------> ERRORED

With an adaptive engine, each poll also feeds rank 0's measurements to it, and every
``decision_interval_s`` its batch plan is sent to the workers and, for elastic runs,
its layout decision starts a resize.

Reports are recorded before failures are judged, so a checkpoint reported just
before a crash is committed and used by the restart. The controller never imports
torch or Ray: it sees ``GroupPoll`` data and executes decisions.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Any

from raylight._time import monotonic, wall
from raylight.adaptive.engine import AdaptiveEngine
from raylight.adaptive.policy import Layout
from raylight.adaptive.profile import SampleRate
from raylight.controller.decisions import (
    RaiseDecision,
    ResizeDecision,
)
from raylight.controller.policies import FailurePolicy, FixedScalingPolicy, ScalingPolicy
from raylight.exceptions import (
    InsufficientResourcesError,
    RaylightError,
    TrainingFailedError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerStartError,
)
from raylight.recorder import RunRecorder
from raylight.worker_group.protocol import (
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


class Controller:
    def __init__(
        self,
        *,
        group: WorkerGroup,
        recorder: RunRecorder,
        num_workers: int,
        failure_policy: FailurePolicy,
        scaling_policy: ScalingPolicy | None = None,
        poll_interval_s: float = 0.2,
        on_poll: Callable[[GroupPoll, Controller], None] | None = None,
        engine: AdaptiveEngine | None = None,
        elastic: bool = False,
        min_workers: int | None = None,
        max_workers: int | None = None,
        threads_for: Callable[[int], int] | None = None,
        decision_interval_s: float = 3.0,
        resize_interval_s: float = 5.0,
        autoscale: bool = False,
        resize_in_place: bool = True,
        trace: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = monotonic,
        sleep: Callable[[float], Any] | None = None,
    ) -> None:
        self.group = group
        self.recorder = recorder
        self.num_workers = num_workers
        self.failure_policy = failure_policy
        self.scaling_policy = scaling_policy or FixedScalingPolicy()
        self.poll_interval_s = poll_interval_s
        self.on_poll = on_poll
        self.state = State.INITIALIZING
        self.num_failures = 0
        self.num_restarts = 0
        self.error: RaylightError | None = None
        self.last_failure: WorkerFailure | None = None
        self._stop = threading.Event()
        self.engine = engine
        self.elastic = elastic
        self.min_workers = min_workers or num_workers
        self.max_workers = max_workers or num_workers
        self.threads_for = threads_for or (lambda k: 1)
        self.threads = self.threads_for(num_workers)
        self.decision_interval_s = decision_interval_s
        self.resize_interval_s = resize_interval_s
        self.autoscale = autoscale
        self.resize_in_place = resize_in_place
        self.trace = trace
        self.clock = clock
        self.sleep = sleep or self._stop.wait  # interruptible by Ctrl-C
        self.rate = SampleRate()
        self._restart_delay = 0.0  # the back-off the failure policy asked for
        self._in_a_row = 0  # failures since the last new checkpoint
        self._failed_at: int | None = None  # the last checkpoint when it last failed
        self._last_message = ""
        self._same = 0  # the same failure message, in a row
        self.resizes: list[dict[str, Any]] = []
        self._pending_resize: tuple[int, str] | None = None  # (workers, reason)
        self._last_batch_decision = clock()
        self._last_layout_decision = clock()
        self._watch: dict[str, Any] | None = None  # a resize waiting for its first step
        self._last_seq = -1  # of the last report recorded
        self._shadow: list[Report] = []  # other ranks' copies of reports not yet recorded

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

    def _initialize(self) -> None:
        self.state = State.SCHEDULING

    def _schedule(self) -> None:
        try:
            if self.elastic and self.num_workers > self.min_workers:  # what the cluster places now
                placed = self.group.reserve(self.num_workers, at_least=self.min_workers)
                if placed != self.num_workers:
                    log.warning("starting %d of %d workers: the cluster placed no more now", placed, self.num_workers)
                    self.num_workers, self.threads = placed, self.threads_for(placed)
        except InsufficientResourcesError as exc:
            self._fail(exc)
            return
        plan = None
        if self.engine is not None:
            plan = self.engine.plan_for(self.num_workers, old_workers=self._plan_workers, threads=self.threads)
        try:
            self.group.start(
                num_workers=self.num_workers, checkpoint=self.recorder.latest, threads=self.threads, plan=plan
            )
        except InsufficientResourcesError as exc:
            self._fail(exc)
            return
        except WorkerStartError as exc:
            failure = WorkerFailure(rank=-1, kind="error", message=str(exc))
            self._handle_failure(failure, cause=exc)
            return
        try:
            self.recorder.begin()  # the run directory appears now that training starts
        except RaylightError as exc:
            self._fail(exc)
            return
        self._plan_workers = self.num_workers
        self.state = State.RUNNING

    _plan_workers = 1  # the size the engine's current plan was made for

    def _poll(self) -> None:
        poll = self.group.poll()
        self._record(poll)
        if self.on_poll is not None:
            self.on_poll(poll, self)
        if poll.failures:
            died = [f for f in poll.failures if f.kind == "died"]
            if self.elastic and died:
                alive = self.num_workers - len(died)
                log.warning("lost %d worker(s) (%s); continuing elastically", len(died), died[0].message)
                self._request_resize(max(alive, 1), f"lost {len(died)} worker(s)")
                return
            self._handle_failure(poll.failures[0])
            return
        if poll.finished:
            if self.engine is not None and self.trace is not None:  # the final state
                self.trace(self.engine.trace_row(num_workers=self.num_workers, threads=self.threads, throughput=self._row_rate()))
            self.state = State.FINISHED
            self.group.shutdown()
            return
        self._decide(poll)

    _spare_ready = False

    def _record(self, poll: GroupPoll) -> None:
        if poll.spare_ready != self._spare_ready:
            self._spare_ready = poll.spare_ready
            if poll.spare_ready and self.trace is not None:
                self.trace({"event": "spare_ready", "workers": self.num_workers})
        for report in poll.reports:
            self.recorder.record(report, num_workers=self.num_workers)
            self._last_seq = max(self._last_seq, report.seq)
        self._shadow = [r for r in (*self._shadow, *poll.shadow_reports) if r.seq > self._last_seq]
        now = self.clock()
        rate = self.rate.update(sum(p.progress.samples for p in poll.polls), now)
        if self._watch is not None:
            rank0 = next((p for p in poll.polls if p.rank == 0), None)
            if rank0 is not None and rank0.progress.batches_since_start > 0:
                # Timed from rank 0's own stamp of its first batch where it has one (wall
                # clocks: the driver's poll interval does not count); else from this poll.
                first = rank0.progress.first_batch_wall
                decided_wall = self._watch.pop("decided_wall", None)
                stopped_wall = self._watch.pop("stopped_wall", None)
                stopped_at = self._watch.pop("stopped_at", self._watch["decided_at"])
                if first is not None and decided_wall is not None:
                    self._watch["first_step_s"] = max(0.0, first - decided_wall)
                    self._watch["pause_s"] = max(0.0, first - (stopped_wall or decided_wall))
                else:
                    self._watch["first_step_s"] = now - self._watch["decided_at"]
                    self._watch["pause_s"] = now - stopped_at
                if self.engine is not None:
                    self.engine.record_restart(self._watch["first_step_s"])
                self.resizes.append(self._watch)
                if self.trace is not None:
                    self.trace({"event": "resized", **self._watch})
                self._watch = None
        if self.engine is None:
            return
        for p in poll.polls:
            if p.rank == 0 and p.adaptive is not None:
                self.engine.observe(p.adaptive)
        self._throughput = rate

    _throughput = 0.0  # samples/s over the rate's window (seconds)
    _row_mark: tuple[float, int] | None = None  # (time, samples) at the last trace row

    def _row_rate(self) -> float:
        """Samples/s since the previous trace row (the window's rate for the first row):
        what each row reports, for the same interval as its measured step time; the
        window's rate lags a batch change by its whole width."""
        now, total = self.clock(), self.rate.total
        mark, self._row_mark = self._row_mark, (now, total)
        if mark is None or now <= mark[0]:
            return self._throughput
        return (total - mark[1]) / (now - mark[0])

    def _decide(self, poll: GroupPoll) -> None:
        decision = self.scaling_policy.decide(poll, num_workers=self.num_workers)
        if isinstance(decision, ResizeDecision) and decision.num_workers != self.num_workers:
            self._request_resize(decision.num_workers, decision.reason)
            return
        engine, now = self.engine, self.clock()
        if engine is None or self._watch is not None:
            return
        if now - self._last_batch_decision >= self.decision_interval_s:
            self._last_batch_decision = now
            plan = engine.decide_batch(num_workers=self.num_workers, threads=self.threads)
            row = engine.trace_row(num_workers=self.num_workers, threads=self.threads, throughput=self._row_rate())
            if plan is not None:
                self.group.set_plan(plan)
                row.update(decision="batch", reason=engine.last_batch_reason)
            if self.trace is not None:
                self.trace(row)
        if self.elastic and now - self._last_layout_decision >= self.resize_interval_s:
            self._last_layout_decision = now
            capacity = min(self.group.capacity(), self.max_workers)
            current = Layout(self.num_workers, self.threads)
            threads_for = {k: self.threads_for(k) for k in range(1, self.max_workers + 1)}
            layout = engine.decide_layout(current=current, capacity=capacity, threads_for=threads_for)
            if self.autoscale and capacity < self.max_workers:
                wanted = engine.decide_layout(current=current, capacity=self.max_workers, threads_for=threads_for)
                if wanted is not None and wanted.layout.num_workers > capacity:
                    self.group.request_resources(wanted.layout.num_workers)
            if layout is not None and layout.layout != current:
                self._request_resize(layout.layout.num_workers, layout.reason)

    def _request_resize(self, num_workers: int, reason: str) -> None:
        target = num_workers
        if self.elastic:
            target = max(self.min_workers, min(self.max_workers, num_workers))
        self._pending_resize = (target, reason)
        self.state = State.RESIZING

    def _resize(self) -> None:
        assert self._pending_resize is not None
        target, reason = self._pending_resize
        self._pending_resize = None
        decided_at, decided_wall = self.clock(), wall()
        old = self.num_workers
        threads = self.threads_for(target)
        plan = None
        if self.engine is not None:
            plan = self.engine.plan_for(target, old_workers=self._plan_workers, threads=threads)
        latest = self.recorder.latest
        commit = int(latest.metadata.get("index", -1)) if latest is not None else -1
        if self.resize_in_place:
            outcome = self.group.resize(num_workers=target, threads=threads, plan=plan, commit=commit)
        else:
            outcome = ResizeOutcome("fallback", reason="resize_in_place is off")
        for report in outcome.reports:
            self.recorder.record(report, num_workers=old)
            self._last_seq = max(self._last_seq, report.seq)
        self._recover_lost_reports([*self._shadow, *outcome.shadow], outcome.adopted, num_workers=old)
        if outcome.kind == "finished":
            self.state = State.RUNNING  # the next poll sees it finished
            return
        latest = self.recorder.latest
        self.recorder.rollback()
        self.num_restarts += 1
        self.threads = threads
        kind = "in_place"
        if outcome.kind == "fallback":
            log.warning("resizing in place failed (%s); restarting from the last checkpoint", outcome.reason)
            self.group.shutdown()
            self.num_workers = target
            self.state = State.SCHEDULING
            kind = "checkpoint"
        else:
            self.num_workers = self.group.num_workers
            self._plan_workers = self.num_workers
            self.state = State.RUNNING
        log.info("resized %d -> %d workers (%s): %s", old, self.num_workers if kind == "in_place" else target, kind, reason)
        self._watch = {
            "kind": kind,
            "from": old,
            "to": target,
            "reason": reason,
            "decided_at": decided_at,
            "restored_checkpoint": None if latest is None else latest.metadata.get("index"),
            "stopped_at": outcome.stopped_at if outcome.stopped_at is not None else decided_at,
            "phases": {k: round(v, 4) for k, v in outcome.phases.items()},
            "decided_wall": decided_wall,
            "stopped_wall": outcome.stopped_wall if outcome.stopped_wall is not None else decided_wall,
        }

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
                report = Report(copy.metrics, adopted[1], copy.time, seq)
                self.recorder.record(report, num_workers=num_workers, commit_index=adopted[0])
            else:
                self.recorder.record(Report(copy.metrics, None, copy.time, seq), num_workers=num_workers)
            self._last_seq = seq
        self._shadow = []

    def _restart(self) -> None:
        self.group.shutdown()
        self.recorder.rollback()
        if self._restart_delay > 0:  # resources are free while it waits
            self.sleep(self._restart_delay)
            self._restart_delay = 0.0
        self.num_restarts += 1
        if self.elastic:  # start with what fits now, within (min, max)
            self.num_workers = max(self.min_workers, min(self.max_workers, self.num_workers))
        self.state = State.SCHEDULING

    # -- failures -----------------------------------------------------------------
    def _handle_failure(self, failure: WorkerFailure, cause: BaseException | None = None) -> None:
        self.num_failures += 1
        self.last_failure = failure
        resume = self.recorder.latest
        commit = int(resume.metadata.get("index", -1)) if resume is not None else -1
        self._in_a_row = self._in_a_row + 1 if commit == self._failed_at else 1
        self._failed_at = commit
        self._same = self._same + 1 if failure.message == self._last_message and self._in_a_row > 1 else 1
        self._last_message = failure.message
        decision = self.failure_policy.decide(failure, num_failures=self.num_failures, in_a_row=self._in_a_row)
        if isinstance(decision, RaiseDecision):
            self._fail(self._error_for(failure), cause=cause)
            return
        self._restart_delay = decision.delay_s
        where = f"checkpoint {resume.metadata.get('index')}" if resume else "the beginning"
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
            "worker rank %s %s; restarting from %s%s (failure %d, max_failures=%s)",
            failure.rank,
            failure.message,
            where,
            wait,
            self.num_failures,
            f"{budget} (without limit)" if budget < 0 else budget,
        )
        self.state = State.RESTARTING

    def _fail(self, error: RaylightError, cause: BaseException | None = None) -> None:
        if cause is not None and error.__cause__ is None:
            error.__cause__ = cause
        self.error = error
        self.state = State.ERRORED
        self.group.shutdown()

    def _error_for(self, failure: WorkerFailure) -> TrainingFailedError:
        budget = self.failure_policy.max_failures
        where = f" (node {failure.node}, pid {failure.pid})" if failure.node else ""
        head = f"worker rank {failure.rank}{where} {failure.message}."
        tail = (
            f" The run failed {self.num_failures} time(s) and max_failures={budget} allows "
            f"{budget} restart(s); raise FailureConfig.max_failures (fit(max_failures=...)) "
            "to restart from the last checkpoint automatically."
        )
        common: dict[str, Any] = {
            "rank": failure.rank,
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

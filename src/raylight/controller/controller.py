"""The driver-side control plane: an explicit state machine over a worker group.

States and transitions (one ``step()`` each)::

    INITIALIZING -> SCHEDULING -> RUNNING -> FINISHED
                        ^            |
                        |            +-- failure, policy says restart --> RESTARTING
                        +---------------------------------------------------+
                                     +-- resize decision -----------------> RESTARTING
                                     +-- failure, policy says raise ------> ERRORED

Reports are recorded before failures are judged, so a checkpoint reported just
before a crash is committed and used by the restart. The controller never imports
torch or Ray: it sees ``GroupPoll`` data and executes decisions.
"""

from __future__ import annotations

import enum
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any

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
from raylight.worker_group.protocol import GroupPoll, WorkerFailure, WorkerGroup

log = logging.getLogger("raylight")


class State(enum.Enum):
    INITIALIZING = "initializing"
    SCHEDULING = "scheduling"
    RUNNING = "running"
    RESTARTING = "restarting"
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

    # -- stepping -----------------------------------------------------------------
    def step(self) -> State:
        handler = {
            State.INITIALIZING: self._initialize,
            State.SCHEDULING: self._schedule,
            State.RUNNING: self._poll,
            State.RESTARTING: self._restart,
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
            self.group.start(num_workers=self.num_workers, checkpoint=self.recorder.latest)
        except InsufficientResourcesError as exc:
            self._fail(exc)
            return
        except WorkerStartError as exc:
            failure = WorkerFailure(rank=-1, kind="error", message=str(exc))
            self._handle_failure(failure, cause=exc)
            return
        self.state = State.RUNNING

    def _poll(self) -> None:
        poll = self.group.poll()
        for report in poll.reports:
            self.recorder.record(report, num_workers=self.num_workers)
        if self.on_poll is not None:
            self.on_poll(poll, self)
        if poll.failures:
            self._handle_failure(poll.failures[0])
            return
        if poll.finished:
            self.state = State.FINISHED
            self.group.shutdown()
            return
        decision = self.scaling_policy.decide(poll, num_workers=self.num_workers)
        if isinstance(decision, ResizeDecision) and decision.num_workers != self.num_workers:
            log.info(
                "resizing %d -> %d workers: %s", self.num_workers, decision.num_workers, decision.reason
            )
            self.num_workers = decision.num_workers
            self.state = State.RESTARTING

    def _restart(self) -> None:
        self.group.shutdown()
        self.recorder.rollback()
        self.num_restarts += 1
        self.state = State.SCHEDULING

    # -- failures -----------------------------------------------------------------
    def _handle_failure(self, failure: WorkerFailure, cause: BaseException | None = None) -> None:
        self.num_failures += 1
        self.last_failure = failure
        decision = self.failure_policy.decide(failure, num_failures=self.num_failures)
        if isinstance(decision, RaiseDecision):
            self._fail(self._error_for(failure), cause=cause)
            return
        resume = self.recorder.latest
        where = f"checkpoint {resume.metadata.get('index')}" if resume else "the beginning"
        log.warning(
            "worker rank %s %s; restarting from %s (failure %d, max_failures=%d)",
            failure.rank,
            failure.message,
            where,
            self.num_failures,
            self.failure_policy.max_failures,
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
        if info.pickled is not None:
            try:
                err.__cause__ = pickle.loads(info.pickled)
            except Exception:  # the exception's class may not exist on the driver
                pass
        return err

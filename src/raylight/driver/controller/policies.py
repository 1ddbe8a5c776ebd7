"""Policies: plain data in, a decision out. No Ray, no torch.

``FailurePolicy`` decides what a failure means. A ``ScalingPolicy`` decides every size,
thread count, batch plan and resource request of a run; the controller asks it and
executes what it returns. ``FixedScalingPolicy`` is the policy of a run of one fixed size;
``controller.scaling.GoodputScalingPolicy`` that of adaptive and elastic runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from raylight.adaptive.plan import BatchPlan
from raylight.driver.controller.decisions import (
    FailureDecision,
    Raise,
    Resize,
    Restart,
    ScalingDecision,
)
from raylight.worker.protocol import GroupPoll, WorkerFailure


class FailurePolicy:
    """Restart after a failure while the run has failed at most ``max_failures`` times
    (-1: always). A failure that follows another with no new checkpoint between them
    waits before its restart: ``backoff_s``, doubling with each such failure in a row, at
    most ``backoff_max_s``; so a deterministic error under ``max_failures=-1`` backs off
    instead of spinning."""

    def __init__(
        self,
        max_failures: int,
        *,
        backoff_s: float = 0.0,
        backoff_max_s: float = 0.0,
        max_preemptions: int = -1,
        rendezvous_retries: int = 0,
        setting: str = "max_failures",
        advice: str = "FailureConfig.max_failures (fit(max_failures=...))",
    ) -> None:
        self.max_failures = max_failures
        # How the run's product names max_failures in its messages (``setting``) and what
        # to change to allow more restarts (``advice``): a declarative run's is
        # backend.trainer.max_failures, which its config sets.
        self.setting = setting
        self.advice = advice
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_preemptions = max_preemptions
        self.rendezvous_retries = rendezvous_retries

    def retries_rendezvous(self, failure: WorkerFailure, *, retried: int) -> bool:
        """Whether to form the group again, not counting a failure: the worker failed to
        join the run's process group (before its loop began; a peer's connection closed
        or refused) and the run has retried that fewer than ``rendezvous_retries`` times.
        A worker that died is a failure as before."""
        error = failure.error
        return failure.kind == "error" and error is not None and error.rendezvous and retried < self.rendezvous_retries

    def delay(self, in_a_row: int) -> float:
        """Seconds to wait before the restart after the ``in_a_row``-th failure with no
        checkpoint committed since the previous one (1: the first; no wait)."""
        if in_a_row <= 1 or self.backoff_s <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(in_a_row - 2, 60))

    def decide(
        self,
        failure: WorkerFailure,
        *,
        num_failures: int,
        in_a_row: int = 1,
        before_progress: WorkerFailure | None = None,
        deterministic: bool = False,
    ) -> FailureDecision:
        """``num_failures`` counts failures so far, this one included; ``in_a_row`` those
        since the last new checkpoint, this one included. ``before_progress``: where this
        attempt failed before its first report, the previous attempt's failure if that one
        too came before any report (else None). ``deterministic``: the failure is an error
        in the code that a restart would raise again (``deterministic_error``); final at
        once, whatever ``max_failures`` allows (-1 included: no restart can get past it).

        The same error twice in a row before any report is final at once, whatever
        ``max_failures`` still allows: nothing ran between them that could change the
        outcome (a NameError in the loop, a missing import, a bad path), so a third try
        would fail the same way. Not under ``max_failures=-1``, where the user asked for
        restarts without limit (they back off instead)."""
        if deterministic:
            return Raise(failure, deterministic=True)
        if self.max_failures >= 0 and before_progress is not None and same_error(before_progress, failure):
            return Raise(failure, repeated=True)
        if self.max_failures < 0 or num_failures <= self.max_failures:
            return Restart(failure, delay_s=self.delay(in_a_row))
        return Raise(failure)

    def decide_preemption(self, failure: WorkerFailure, *, num_preemptions: int) -> FailureDecision:
        """A worker lost with its node after a notice: its own budget, ``max_preemptions``
        (-1: always), not ``max_failures``; restarted at once (the cause was outside)."""
        if self.max_preemptions < 0 or num_preemptions <= self.max_preemptions:
            return Restart(failure)
        return Raise(failure)


def lost_workers(failures: list[WorkerFailure]) -> list[WorkerFailure]:
    """The workers a poll shows lost: dead, or silent (no answer to a health poll within
    ``health_check_timeout_s``: its machine cut off, its node not yet declared dead). An
    elastic run goes on without them (``ScalingPolicy.on_lost``), as the peers' hangs and
    collective errors that follow from them say nothing more. A worker that answers is never
    lost, however long it made no progress: a hang of its own is a failure."""
    return [f for f in failures if f.rank >= 0 and (f.kind == "died" or (f.kind == "hang" and not f.answered))]


def error_signature(failure: WorkerFailure) -> tuple[str, str, str] | None:
    """What makes two errors the same one: the exception's type, its message and the
    innermost frame of its traceback (file and line, not the rank that raised it). None
    for what is not an error the loop raised (a death, a hang, a failed start)."""
    info = failure.error
    if failure.kind != "error" or info is None:
        return None
    frames = [line.strip() for line in info.traceback.splitlines() if line.lstrip().startswith('File "')]
    return info.exc_type, info.message, frames[-1] if frames else ""


def same_error(previous: WorkerFailure, failure: WorkerFailure) -> bool:
    """Whether ``failure`` repeats ``previous`` (``error_signature``)."""
    mine = error_signature(failure)
    return mine is not None and mine == error_signature(previous)


# Exceptions that, raised by the loop before its first step, say the code is wrong (a
# typo, a wrong argument or attribute, a missing module, a syntax error in a module the
# loop imports): the restarted loop runs the same code on the same state and raises the
# same error at the same line, so a retry only costs a restart (tens of seconds). So does
# raylight's ConfigError raised in a worker (a setting the model cannot take: FSDP's blocks
# naming no module of it, a 0-dim parameter to shard, ...): the model and settings are the same.
DETERMINISTIC_ERRORS = frozenset({
    "NameError", "UnboundLocalError", "TypeError", "AttributeError",
    "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "TabError",
    "raylight.base.exceptions.ConfigError",
})


def deterministic_error(failures: list[WorkerFailure], *, steps: int, reports: int) -> bool:
    """Whether one poll's failures are an error in the code that a restart would raise
    again: every rank that failed raised one of ``DETERMINISTIC_ERRORS`` with the same
    type, message and innermost frame (``error_signature``), none died or hung, and it
    came before or at the attempt's first step (``steps``: the most batches any rank
    took since the attempt began; ``reports``: the attempt's reports, none). A rank that
    had not failed yet when the driver saw the others does not count against it: ranks
    blocked in a collective on the failed one fail only later, with another error."""
    if not failures or steps > 1 or reports > 0:
        return False
    first = error_signature(failures[0])
    if first is None or first[0] not in DETERMINISTIC_ERRORS:
        return False
    return all(error_signature(f) == first for f in failures)


@dataclass(frozen=True)
class ScalingView:
    """What a scaling policy sees at one poll: the time, the running layout, the poll, and
    how many workers the cluster could run now (asked only when the policy needs it)."""

    now: float
    num_workers: int
    threads: int
    poll: GroupPoll
    capacity: Callable[[], int]


class ScalingPolicy(Protocol):
    """Every sizing decision of a run, in one place."""

    def start_size(self, capacity: Callable[[], int]) -> int:
        """Workers to start with (``capacity()``: how many the cluster could run now)."""

    def restart_size(self, num_workers: int) -> int:
        """Workers to restart with after a failure of a group of ``num_workers``."""

    def fewest(self, num_workers: int) -> int:
        """The fewest workers to accept when ``num_workers`` are asked for and the
        cluster cannot place them all now."""

    def threads(self, num_workers: int) -> int:
        """torch threads per worker in a group of ``num_workers``."""

    def plan(self, num_workers: int) -> BatchPlan | None:
        """The batch plan for a group of ``num_workers`` about to start (None: the
        workers derive it from their loader)."""

    def started(self, num_workers: int) -> None:
        """A group of ``num_workers`` runs now, with ``plan(num_workers)``."""

    def observe(self, poll: GroupPoll) -> None:
        """What this poll measured (every poll, resizing or not)."""

    def decide(self, view: ScalingView) -> list[ScalingDecision]:
        """What to change now; nothing to change is an empty list."""

    def on_lost(self, num_workers: int, lost: int) -> Resize | None:
        """``lost`` of ``num_workers`` died: a resize to go on without them, or None (a
        failure for the failure policy)."""

    def on_notice(self, num_workers: int, leaving: frozenset[int]) -> Resize | None:
        """The ranks ``leaving`` are on nodes given notice: the resize that lets them go
        (with a snapshot where the workers can agree on a step to take it), or None: they
        run until their node goes, and the run restarts then."""

    def record_restart(self, seconds: float) -> None:
        """A resize took ``seconds`` from decision to the first step."""

    def finish(self, view: ScalingView) -> None:
        """The run finished."""

    def display_fields(self, num_workers: int, threads: int) -> dict[str, Any]:
        """Fields for the progress display."""


class FixedScalingPolicy:
    """A run of ``num_workers`` workers with ``threads`` each, from start to end.
    ``snapshot_on_notice``: its loop stops itself at a boundary of its own when asked
    (``raylight run``'s agent tells its script), so a notice restarts it from a snapshot
    taken there; otherwise it has no step boundary the workers agree on, and trains on
    until the noticed node goes."""

    def __init__(self, num_workers: int, threads: int, *, snapshot_on_notice: bool = False) -> None:
        self.num_workers = num_workers
        self._threads = threads
        self.snapshot_on_notice = snapshot_on_notice

    def start_size(self, capacity: Callable[[], int]) -> int:
        return self.num_workers

    def restart_size(self, num_workers: int) -> int:
        return self.num_workers

    def fewest(self, num_workers: int) -> int:
        return num_workers

    def threads(self, num_workers: int) -> int:
        return self._threads

    def plan(self, num_workers: int) -> BatchPlan | None:
        return None

    def started(self, num_workers: int) -> None:
        pass

    def observe(self, poll: GroupPoll) -> None:
        pass

    def decide(self, view: ScalingView) -> list[ScalingDecision]:
        return []

    def on_lost(self, num_workers: int, lost: int) -> Resize | None:
        return None

    def on_notice(self, num_workers: int, leaving: frozenset[int]) -> Resize | None:
        if not self.snapshot_on_notice:
            return None  # no step boundary the workers agree on: no snapshot
        why = f"preemption notice for rank(s) {sorted(leaving)}"
        return Resize(self.num_workers, why, True, frozenset(range(num_workers)), snapshot=True)

    def record_restart(self, seconds: float) -> None:
        pass

    def finish(self, view: ScalingView) -> None:
        pass

    def display_fields(self, num_workers: int, threads: int) -> dict[str, Any]:
        return {}

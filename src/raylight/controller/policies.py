"""Policies: plain data in, a decision out. No Ray, no torch."""

from __future__ import annotations

from typing import Protocol

from raylight.controller.decisions import (
    ContinueDecision,
    FailureDecision,
    RaiseDecision,
    RestartDecision,
    ScalingDecision,
)
from raylight.worker_group.protocol import GroupPoll, WorkerFailure


class FailurePolicy:
    """Restart after a failure while the run has failed at most ``max_failures`` times
    (-1: always). A failure that follows another with no new checkpoint between them
    waits before its restart: ``backoff_s``, doubling with each such failure in a row, at
    most ``backoff_max_s``; so a deterministic error under ``max_failures=-1`` backs off
    instead of spinning."""

    def __init__(self, max_failures: int, *, backoff_s: float = 0.0, backoff_max_s: float = 0.0) -> None:
        self.max_failures = max_failures
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    def delay(self, in_a_row: int) -> float:
        """Seconds to wait before the restart after the ``in_a_row``-th failure with no
        checkpoint committed since the previous one (1: the first; no wait)."""
        if in_a_row <= 1 or self.backoff_s <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(in_a_row - 2, 60))

    def decide(self, failure: WorkerFailure, *, num_failures: int, in_a_row: int = 1) -> FailureDecision:
        """``num_failures`` counts failures so far, this one included; ``in_a_row`` those
        since the last new checkpoint, this one included."""
        if self.max_failures < 0 or num_failures <= self.max_failures:
            return RestartDecision(failure, delay_s=self.delay(in_a_row))
        return RaiseDecision(failure)


class ScalingPolicy(Protocol):
    def decide(self, poll: GroupPoll, *, num_workers: int) -> ScalingDecision: ...


class FixedScalingPolicy:
    """Never resizes: the default until the adaptive engine decides sizes."""

    def decide(self, poll: GroupPoll, *, num_workers: int) -> ScalingDecision:
        return ContinueDecision()

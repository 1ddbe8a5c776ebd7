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
    (-1: always)."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures

    def decide(self, failure: WorkerFailure, *, num_failures: int) -> FailureDecision:
        """``num_failures`` counts failures so far, this one included."""
        if self.max_failures < 0 or num_failures <= self.max_failures:
            return RestartDecision(failure)
        return RaiseDecision(failure)


class ScalingPolicy(Protocol):
    def decide(self, poll: GroupPoll, *, num_workers: int) -> ScalingDecision: ...


class FixedScalingPolicy:
    """Never resizes: the default until the adaptive engine decides sizes."""

    def decide(self, poll: GroupPoll, *, num_workers: int) -> ScalingDecision:
        return ContinueDecision()

"""Decisions: what a policy returns and the controller alone executes."""

from __future__ import annotations

from dataclasses import dataclass

from raylight.worker_group.protocol import WorkerFailure


@dataclass(frozen=True)
class ContinueDecision:
    """Keep running as is."""


@dataclass(frozen=True)
class RestartDecision:
    """Tear the group down and start it again from the last committed checkpoint, after
    ``delay_s`` seconds (a back-off when failures repeat without progress)."""

    failure: WorkerFailure
    delay_s: float = 0.0


@dataclass(frozen=True)
class RaiseDecision:
    """Give up: the failure is final."""

    failure: WorkerFailure


@dataclass(frozen=True)
class ResizeDecision:
    """Run on ``num_workers`` workers from now on (issued by a scaling policy)."""

    num_workers: int
    reason: str = ""


FailureDecision = RestartDecision | RaiseDecision
ScalingDecision = ContinueDecision | ResizeDecision

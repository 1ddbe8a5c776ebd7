"""Decisions: what a policy returns and the controller alone executes.

Scaling policies return ``SetPlan``, ``Resize`` and ``RequestResources`` (nothing to do:
an empty list); the failure policy returns ``Restart`` or ``Raise``. Each is plain data
that says why, so the controller's log and the trace can tell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raylight.adaptive.plan import BatchPlan
    from raylight.worker.protocol import WorkerFailure


@dataclass(frozen=True)
class SetPlan:
    """Send the workers a new batch plan; they switch at the same step boundary."""

    plan: BatchPlan
    reason: str = ""


@dataclass(frozen=True)
class Resize:
    """Run on ``num_workers`` workers from now on: in place (live workers keep the state)
    when ``in_place``, else from the last committed checkpoint."""

    num_workers: int
    reason: str = ""
    in_place: bool = True
    # A preemption notice: these ranks go (their node is leaving), and every worker
    # checkpoints where it stops, so the steps since the last checkpoint are not lost.
    leaving: frozenset[int] = frozenset()
    snapshot: bool = False


@dataclass(frozen=True)
class RequestResources:
    """Ask an autoscaling cluster for room for ``num_workers`` workers (the run's whole
    size: fewer than before gives the rest back)."""

    num_workers: int
    reason: str = ""


@dataclass(frozen=True)
class Restart:
    """Tear the group down and start it again from the last committed checkpoint, after
    ``delay_s`` seconds (a back-off when failures repeat without progress)."""

    failure: WorkerFailure
    delay_s: float = 0.0


@dataclass(frozen=True)
class Raise:
    """Give up: the failure is final. ``repeated``: not for want of restarts, but because
    it is the same error as the previous attempt's, both before any report (a restart
    would fail again). ``deterministic``: not for want of restarts either, but because it
    is an error in the code that any restart raises again (a NameError, TypeError,
    AttributeError, ImportError or SyntaxError before the first step: ``deterministic_error``)."""

    failure: WorkerFailure
    repeated: bool = False
    deterministic: bool = False


ScalingDecision = SetPlan | Resize | RequestResources
FailureDecision = Restart | Raise

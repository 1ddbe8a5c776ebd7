"""Workers as Ray actors in a placement group: start, rendezvous, poll, shutdown."""

from raylight.worker.protocol import (
    ErrorInfo,
    GroupPoll,
    Progress,
    Report,
    WorkerFailure,
    WorkerGroup,
    WorkerPoll,
)

__all__ = [
    "ErrorInfo",
    "GroupPoll",
    "Progress",
    "Report",
    "WorkerFailure",
    "WorkerGroup",
    "WorkerPoll",
]

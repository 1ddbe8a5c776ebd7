"""The one raylight error hierarchy.

Every error is picklable (it crosses Ray actor boundaries) and its message says
which setting or input to change. User mistakes raise ``ConfigError``; failures at
run time raise a ``TrainingFailedError`` subclass that names the worker.
"""

from __future__ import annotations

__all__ = [
    "ClusterConnectionError",
    "ConfigError",
    "InsufficientResourcesError",
    "RaylightError",
    "RunInUseError",
    "TrainingDivergedError",
    "TrainingFailedError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHangError",
    "WorkerImportError",
    "WorkerStartError",
]


class RaylightError(Exception):
    """Base class of every error raylight raises on purpose."""

    def __reduce__(self):  # keep subclasses with keyword state picklable
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class ConfigError(RaylightError, ValueError):
    """A setting or input is invalid. The message names the key path and the fix."""


class ClusterConnectionError(RaylightError, ConnectionError):
    """The Ray cluster named by ``address`` (or ``RAY_ADDRESS``) cannot be reached."""


class RunInUseError(RaylightError):
    """Another driver is writing this run (it holds the run directory's lease), or took
    it over from this one.

    Attributes:
        holder: what the lease file says of the holder: host, pid, id, since.
    """

    def __init__(self, message: str, *, holder: dict | None = None) -> None:
        super().__init__(message)
        self.holder = dict(holder or {})


class InsufficientResourcesError(RaylightError):
    """The cluster cannot give the workers the resources they ask for."""


class WorkerStartError(RaylightError):
    """Workers could not be started or could not form a process group in time."""


class WorkerImportError(WorkerStartError):
    """The workers cannot import a module the training loop or its config needs (or
    raylight itself). Not retried: a restart would fail the same way.

    Attributes:
        module: the module that failed to import.
    """

    def __init__(self, message: str, *, module: str = "") -> None:
        super().__init__(message)
        self.module = module


class TrainingFailedError(RaylightError):
    """Training stopped because a worker failed more often than ``max_failures`` allows.

    Attributes:
        rank: global rank of the worker that failed first (``None`` if unknown).
        node: node IP address of that worker.
        reason: a short description of the failure.
        num_failures: how many failures the run had, this one included.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        node: str | None = None,
        reason: str = "",
        num_failures: int = 0,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.reason = reason
        self.num_failures = num_failures


class TrainingDivergedError(RaylightError):
    """The loss became NaN or infinite: training cannot go on from there. The message
    names the epoch and the settings that usually cause it."""


class WorkerError(TrainingFailedError):
    """The user's training loop raised on a worker.

    ``exc_type``, ``exc_message`` and ``worker_traceback`` describe the original
    exception; the original object is chained as ``__cause__`` when it could be pickled.
    """

    def __init__(
        self,
        message: str,
        *,
        exc_type: str = "",
        exc_message: str = "",
        worker_traceback: str = "",
        **kwargs,
    ) -> None:
        super().__init__(message, **kwargs)
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback


class WorkerDiedError(TrainingFailedError):
    """A worker process died (killed, out of memory, or its node was lost)."""


class PreemptedError(WorkerDiedError):
    """The run lost more nodes to preemption than ``FailureConfig.max_preemptions``
    allows. The CLI exits with ``raylight.base.exit_codes.PREEMPTED_EXIT_CODE`` for it, which
    ``raylight submit --retries`` resubmits (the run resumes from its last checkpoint)."""


class WorkerHangError(TrainingFailedError):
    """A worker made no progress, or did not answer health checks, for too long."""


class ResizeInterrupt(BaseException):
    """Control flow, not an error (hence BaseException); here, not in the torch-using step sync,
    so that the launch agent raises it without importing torch.

    Raised at a step boundary on every rank when the group is about to be resized.
    ``snapshot``: some rank was asked to checkpoint there (a preemption notice), so every
    rank takes its part of a checkpoint of the state at this boundary before stopping."""

    def __init__(self, snapshot: bool = False) -> None:
        super().__init__()
        self.snapshot = snapshot

"""What a worker group tells the controller: plain data, no Ray, no torch.

The controller only sees these types, so tests drive it with a fake group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.base.cost import WorkerPlace

if TYPE_CHECKING:
    from raylight.storage.checkpoint import Checkpoint

WorkerState = Literal["starting", "running", "finished", "errored", "paused"]
FailureKind = Literal["error", "died", "hang"]


@dataclass(frozen=True)
class Report:
    """One ``ctx.report`` call of rank 0. ``checkpoint`` is the serialised state (for a
    sharded checkpoint, its skeleton: the workers wrote the shards as checkpoint
    ``sharded_index`` of the run)."""

    metrics: dict[str, Any]
    checkpoint: bytes | None = None
    time: float = 0.0
    seq: int = -1  # the same on every rank for the same ctx.report call
    has_checkpoint: bool = False  # set on ranks other than 0, which send no bytes
    sharded_index: int | None = None  # the index whose directory holds the shards
    # A preemption's just-in-time checkpoint: committed, but not a row of the history.
    snapshot: bool = False


@dataclass(frozen=True)
class CheckpointTarget:
    """Where the workers of a run write sharded checkpoints: the run's checkpoints
    directory (a URI every worker reaches) and the index the driver commits next."""

    directory: str
    next_index: int


@dataclass(frozen=True)
class Progress:
    """Where a worker is: epoch and step of its prepared loader, samples consumed."""

    epoch: int | None = None
    step: int = 0
    steps_per_epoch: int | None = None
    samples: int = 0
    batches_since_start: int = 0  # batches handed out since the loop last (re)started
    first_batch_wall: float | None = None  # wall-clock time of the first of those


@dataclass(frozen=True)
class ErrorInfo:
    exc_type: str
    message: str
    traceback: str
    # The exception itself, as an object in Ray's store (Ray's serialisation, the only
    # one): the worker group fetches it into WorkerFailure.cause. None: not serialisable.
    exception: Any = None
    time: float = 0.0  # wall clock when it was raised
    # Raised while the worker joined the run's process group, before the loop began
    # (FailureConfig.rendezvous_retries).
    rendezvous: bool = False


@dataclass(frozen=True)
class WorkerPoll:
    rank: int
    state: WorkerState
    reports: list[Report] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    seconds_since_progress: float = 0.0
    error: ErrorInfo | None = None
    adaptive: AdaptiveStats | None = None
    # False while the worker still joins its process group (the rendezvous, bounded by
    # worker_start_timeout_s); hang_timeout_s counts from when its loop starts.
    joined: bool = True
    commit: int = -1  # index of the last checkpoint this worker holds in memory
    notice: NodeNotice | None = None  # a preemption notice this worker's node was given
    # Lines a product's loop forwards to the driver since the last poll, as (stream, text):
    # `raylight run` sends its child process's stdout and stderr this way.
    output: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class NodeNotice:
    """NodeNotice that a node is about to go (spot preemption, maintenance, a pod's SIGTERM).
    ``node_id``: the Ray node; ``deadline``: wall-clock seconds when it goes (None:
    unknown); ``source``: who said so ("drain", "sigterm", "aws", ...)."""

    node_id: str
    source: str
    reason: str = ""
    deadline: float | None = None


@dataclass(frozen=True)
class WorkerFailure:
    rank: int  # -1: the group's start failed, no one worker did (its message says what)
    kind: FailureKind
    message: str
    node: str | None = None
    pid: int | None = None
    error: ErrorInfo | None = None
    seconds_since_progress: float = 0.0
    cause: BaseException | None = None  # the worker's exception, where it could be fetched
    node_id: str | None = None  # the Ray node it ran on
    # False: its health poll got no answer within health_check_timeout_s (its process, or
    # its machine's link, is gone while Ray has not declared the node dead: a partition).
    answered: bool = True

    @property
    def known_rank(self) -> int | None:
        return self.rank if self.rank >= 0 else None

    def described(self, *, where: bool = False) -> str:
        """``worker rank 1 <message>`` (``where``: with its node and pid, when known); a
        failure of the group's start is its message alone."""
        if self.rank < 0:
            return self.message
        at = f" (node {self.node}, pid {self.pid})" if where and self.node else ""
        return f"worker rank {self.rank}{at} {self.message}"


_SEVERITY = {"died": 0, "hang": 1, "error": 2}


# How a collective fails on a rank whose peer left it (gloo's, nccl's, torch's wrappers).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "DistBackendError", "DistNetworkError")


def with_finished_peers(failures: list[WorkerFailure], polls: list[WorkerPoll]) -> list[WorkerFailure]:
    """Failures of ranks that hung, or whose collective lost its peer, saying which other
    ranks had finished their loops: a collective that only some ranks call (a checkpoint
    report under a sharded strategy, ``ctx.all_reduce`` or ``ctx.barrier`` inside ``if
    ctx.rank == 0:``) waits for ever, or fails with gloo's "Connection closed by peer
    ... typically caused by a remote worker crashing" when the finished rank's process
    group goes, and neither says why."""
    finished = sorted(p.rank for p in polls if p.state == "finished")
    if not finished:
        return failures
    who = f"rank{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))}"
    hint = (
        f" ({who} had finished the loop: a collective that only some ranks call, such as "
        "ctx.report(checkpoint=...) under FSDP or DeepSpeed, or ctx.all_reduce or ctx.barrier "
        "inside `if ctx.rank == 0:`, waits for or fails on the ranks that never call it; "
        "call it on every rank)"
    )

    def peer_gone(f: WorkerFailure) -> bool:
        if f.kind == "hang":
            return True
        return f.kind == "error" and f.error is not None and any(
            mark in f"{f.error.exc_type}: {f.error.message}" for mark in _PEER_GONE
        )

    return [replace(f, message=f.message + hint) if f.rank >= 0 and f.rank not in finished and peer_gone(f) else f for f in failures]


@dataclass(frozen=True)
class GroupPoll:
    """One poll of every worker. ``failures`` is sorted root cause first."""

    polls: list[WorkerPoll]
    failures: list[WorkerFailure] = field(default_factory=list)
    spare_ready: bool = False  # a warm spare waits to join when the group grows
    notices: list[NodeNotice] = field(default_factory=list)  # nodes of this group given notice
    # Where the workers run (rank, node, node type, resources): what the run's cost counts.
    placement: tuple[WorkerPlace, ...] = ()

    @property
    def ranks_on(self) -> dict[str, list[int]]:
        """Node id -> the ranks on it."""
        found: dict[str, list[int]] = {}
        for place in self.placement:
            found.setdefault(place.node_id, []).append(place.rank)
        return found

    @property
    def finished(self) -> bool:
        return not self.failures and all(p.state == "finished" for p in self.polls)

    @property
    def reports(self) -> list[Report]:
        """Reports of rank 0, in order."""
        return [r for p in self.polls if p.rank == 0 for r in p.reports]

    @property
    def shadow_reports(self) -> list[Report]:
        """The same reports as made by the lowest other rank: what the driver uses for
        the reports rank 0 made but could not deliver before it died."""
        others = [p for p in self.polls if p.rank != 0]
        return min(others, key=lambda p: p.rank).reports if others else []

    @staticmethod
    def root_cause_first(failures: list[WorkerFailure]) -> list[WorkerFailure]:
        # A dead worker makes its peers' collectives fail: report the death, not the echo.
        # Among hung workers, the one idle longest stopped first; the others wait on it.
        # Among errors, the first raised is the cause; peers' collectives fail after it.
        return sorted(
            failures,
            key=lambda f: (
                _SEVERITY[f.kind],
                -f.seconds_since_progress,
                f.error.time if f.error is not None else 0.0,
                f.rank,
            ),
        )


@dataclass(frozen=True)
class ResizeOutcome:
    """What an in-place resize did: "in_place", "finished" (training ended meanwhile),
    "fallback" (no live worker holds the state: restart from the checkpoint) or
    "unchanged" (a group that was to grow got no new worker: it trains on untouched).
    ``reports`` are those rank 0 made while the group stopped."""

    kind: Literal["in_place", "finished", "fallback", "unchanged"]
    reports: list[Report] = field(default_factory=list)
    reason: str = ""
    shadow: list[Report] = field(default_factory=list)  # other ranks' copies, in order
    # A checkpoint newer than the driver's that survivors hold (its reporter died before
    # the driver heard of it): (index, state, report seq); the driver commits it.
    adopted: tuple[int, bytes, int] | None = None
    stopped_at: float | None = None  # monotonic time the old group was told to stop
    stopped_wall: float | None = None  # the same moment on the wall clock
    phases: dict[str, float] = field(default_factory=dict)  # seconds: spawn, stop, launch


class WorkerGroup(Protocol):
    """The controller's handle on a set of workers running one training loop."""

    @property
    def num_workers(self) -> int: ...

    def start(
        self,
        *,
        num_workers: int,
        checkpoint: Checkpoint | None,
        threads: int | None = None,
        plan: BatchPlan | None = None,
        target: CheckpointTarget | None = None,
    ) -> None:
        """Start ``num_workers`` workers, restoring ``checkpoint`` if given; sharded
        checkpoints are written to ``target``.

        Raises InsufficientResourcesError or WorkerStartError.
        """

    def reserve(self, num_workers: int, *, at_least: int) -> int:
        """Hold resources for up to ``num_workers`` workers, fewer (down to ``at_least``)
        where the cluster cannot place them now; returns how many. ``start`` uses them.

        Raises InsufficientResourcesError when not even ``at_least`` can be placed.
        """

    def poll(self) -> GroupPoll: ...

    def shutdown(self) -> None:
        """Stop every worker and release their resources. Idempotent."""

    def set_plan(self, plan: BatchPlan) -> None:
        """Send a new batch plan; the workers switch at the same step boundary."""

    def capacity(self) -> int:
        """How many workers could run now."""

    def request_resources(self, num_workers: int) -> None:
        """Ask an autoscaling cluster for room for ``num_workers`` workers."""

    def resize(
        self,
        *,
        num_workers: int,
        threads: int | None,
        plan: BatchPlan | None,
        commit: int,
        target: CheckpointTarget | None = None,
        leaving: frozenset[int] = frozenset(),
        snapshot: bool = False,
        on_stopped: Callable[[list[Report]], None] | None = None,
    ) -> ResizeOutcome:
        """Resize in place, restoring checkpoint ``commit`` from a survivor's memory (a
        sharded one's tensors from ``target``'s directory). ``leaving``: ranks that go
        (on a node given notice); ``snapshot``: the workers checkpoint where they stop
        (that checkpoint is restored instead). ``on_stopped``: called with rank 0's
        reports once every worker stopped, before any goes (then not in the outcome)."""

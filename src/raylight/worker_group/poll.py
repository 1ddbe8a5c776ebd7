"""What one health poll of a worker group says: each worker's answer judged (hung,
died, errored, not joined, silent too long), and the notices for the nodes the group
runs on (Ray draining them, what the workers were told).

Functions of the answers and the run's ``FailureConfig``; the worker group sends the
polls and keeps the drain check's clock (``NoticeWatch``).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayError

from raylight.base.clock import monotonic
from raylight.config import FailureConfig
from raylight.worker.protocol import NodeNotice, WorkerFailure, WorkerPoll
from raylight.worker_group.placement import DRAIN_CHECK_S, draining_nodes


def judge(
    refs: list[Any], nodes: list[dict[str, Any]], failure: FailureConfig
) -> tuple[list[WorkerPoll], list[WorkerFailure]]:
    """Wait up to ``health_check_timeout_s`` for the answers to ``refs`` (one poll per
    rank, on ``nodes``; None for a rank already found silent, not asked again); returns
    the answers received and the failures they show."""
    timeout = failure.health_check_timeout_s
    asked = [ref for ref in refs if ref is not None]
    ready, _ = ray.wait(asked, num_returns=len(asked), timeout=timeout) if asked else ([], [])
    ready_set = set(ready)
    polls: list[WorkerPoll] = []
    failures: list[WorkerFailure] = []
    for rank, ref in enumerate(refs):
        node = nodes[rank]
        where: dict[str, Any] = {"node": node.get("ip"), "pid": node.get("pid"), "node_id": node.get("node_id")}
        if ref not in ready_set:
            failures.append(
                WorkerFailure(
                    rank,
                    "hang",
                    f"did not answer a health check within "
                    f"FailureConfig.health_check_timeout_s={timeout:g}s",
                    answered=False,
                    **where,
                )
            )
            continue
        try:
            poll: WorkerPoll = ray.get(ref)
        except (RayActorError, ObjectLostError) as exc:  # lost: its node died with the answer
            failures.append(WorkerFailure(rank, "died", death_reason(exc), **where))
            continue
        except RayError as exc:  # the poll itself failed (its answer did not serialise)
            cause = getattr(exc, "cause", None) or exc
            failures.append(WorkerFailure(rank, "error", f"could not be polled: {type(cause).__name__}: {cause}", **where))
            continue
        polls.append(poll)
        found = _failure_of(rank, poll, failure, where)
        if found is not None:
            failures.append(found)
    return polls, failures


def _failure_of(rank: int, poll: WorkerPoll, failure: FailureConfig, where: dict[str, Any]) -> WorkerFailure | None:
    """What an answered poll says went wrong: an error, a worker that did not join its
    group in time, or one silent too long; None when nothing did."""
    if poll.state == "errored" and poll.error is not None:
        return WorkerFailure(
            rank,
            "error",
            f"raised {poll.error.exc_type}: {poll.error.message}",
            error=poll.error,
            cause=fetch_exception(poll.error.exception, failure.health_check_timeout_s),
            **where,
        )
    if poll.state == "running" and not poll.joined:
        if poll.seconds_since_progress > failure.worker_start_timeout_s:
            return WorkerFailure(
                rank,
                "hang",
                f"did not join its process group within "
                f"FailureConfig.worker_start_timeout_s={failure.worker_start_timeout_s:g}s",
                seconds_since_progress=poll.seconds_since_progress,
                **where,
            )
        return None
    if poll.state == "running" and poll.seconds_since_progress > failure.hang_timeout_s:
        return WorkerFailure(
            rank,
            "hang",
            f"made no progress for {poll.seconds_since_progress:.0f}s "
            f"(FailureConfig.hang_timeout_s={failure.hang_timeout_s:g}s)",
            seconds_since_progress=poll.seconds_since_progress,
            **where,
        )
    return None


class NoticeWatch:
    """The nodes Ray is draining, asked at most every DRAIN_CHECK_S."""

    def __init__(self) -> None:
        self.draining: dict[str, float | None] = {}
        self._checked = -DRAIN_CHECK_S

    def notices(self, polls: list[WorkerPoll], nodes: set[str]) -> list[NodeNotice]:
        """Notices for the nodes this group runs on: Ray draining them (checked every
        DRAIN_CHECK_S), and what the workers were told (a SIGTERM, a cloud's notice)."""
        now = monotonic()
        if now - self._checked >= DRAIN_CHECK_S:
            self._checked = now
            self.draining = draining_nodes()
        found = {
            node: NodeNotice(node, "drain", "Ray is draining the node (ray drain-node, the autoscaler or the cloud)", deadline)
            for node, deadline in self.draining.items()
            if node in nodes
        }
        for p in polls:
            if p.notice is not None and p.notice.node_id not in found:
                found[p.notice.node_id] = p.notice
        return list(found.values())


def fetch_exception(ref: Any, timeout_s: float) -> BaseException | None:
    """A worker's exception, deserialised by Ray from the object the worker put; None
    where it cannot be (its class does not exist here, the worker is gone)."""
    if ref is None:
        return None
    try:
        value = ray.get(ref, timeout=timeout_s)
    except Exception:  # the text, type and traceback still reach the user
        return None
    return value if isinstance(value, BaseException) else None


def death_reason(exc: RayError) -> str:
    text = str(exc).strip()
    for marker in ("SIGKILL", "out of memory", "OOM", "node", "exit"):
        for line in text.splitlines():
            if marker.lower() in line.lower():
                return f"died: {line.strip()}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"died: {first}"

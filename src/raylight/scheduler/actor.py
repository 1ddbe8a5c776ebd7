"""The scheduler actor: one detached, named Ray actor over ``SchedulerState``.

Named ``SCHEDULER_NAME`` in namespace ``NAMESPACE``, detached (it outlives the process
that started it) and with no CPU of its own (``num_cpus=0``: it answers calls, it does
not compute much). Its nodes are the cluster's alive nodes (``ray.nodes()``). Killed and
started again, it holds nothing until the jobs' next reports, which re-register them;
meanwhile the jobs keep training on their last allocation.
"""

from __future__ import annotations

from typing import Any

import ray
import ray.exceptions

from raylight.scheduler.state import STALE_AFTER_S, SchedulerState

NAMESPACE = "raylight"
SCHEDULER_NAME = "raylight-scheduler"


def alive_nodes() -> dict[str, dict[str, float]]:
    """Each alive node's total resources, by node id."""
    return {
        n["NodeID"]: {k: float(v) for k, v in n.get("Resources", {}).items()}
        for n in ray.nodes() if n.get("Alive")
    }


class Scheduler:
    """The actor's class (``start`` makes it a Ray actor); every method returns plain data."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self.state = SchedulerState(alive_nodes, stale_after_s=stale_after_s)

    def register(self, job_id: str, **fields: Any) -> dict[str, Any]:
        return self.state.register(job_id, **fields)

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return self.state.report(job_id, model, **fields)

    def unregister(self, job_id: str) -> None:
        self.state.unregister(job_id)

    def status(self) -> dict[str, Any]:
        return self.state.status()

    def allocation_history(self) -> list[dict[str, Any]]:
        return self.state.allocation_history()

    def ping(self) -> bool:
        return True


START_TIMEOUT_S = 60.0  # start(timeout_s=): from asking Ray for the actor to its first answer


def start(*, stale_after_s: float = STALE_AFTER_S, timeout_s: float = START_TIMEOUT_S) -> Any:
    """The scheduler's handle on the connected cluster, started if it is not running."""
    actor: Any = ray.remote(Scheduler)
    handle = actor.options(
        name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_concurrency=1,
    ).remote(stale_after_s)
    try:
        ray.get(handle.ping.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(
            f"the raylight scheduler did not answer within timeout_s={timeout_s:g} s of starting; "
            "check the cluster's health (ray status) or raise timeout_s"
        ) from None
    return handle


def find() -> Any | None:
    """The running scheduler's handle, or None (one GCS lookup, milliseconds)."""
    try:
        return ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def stop() -> bool:
    """End the running scheduler; whether there was one. The jobs keep their last allocation."""
    handle = find()
    if handle is None:
        return False
    ray.kill(handle, no_restart=True)
    return True

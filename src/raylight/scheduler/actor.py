"""The scheduler actor: one detached, named Ray actor over ``SchedulerState``.

Named ``SCHEDULER_NAME`` in namespace ``NAMESPACE``, detached (it outlives the process
that started it) and with no CPU of its own (``num_cpus=0``: it answers calls, it does
not compute much). Its nodes are the cluster's alive nodes (``ray.nodes()``). Killed and
started again, it holds nothing until the jobs' next reports, which re-register them;
meanwhile the jobs keep training on their last allocation.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray
import ray.exceptions

from raylight.scheduler.nodes import alive_nodes
from raylight.scheduler.state import STALE_AFTER_S, SchedulerState

log = logging.getLogger("raylight")

NAMESPACE = "raylight"
SCHEDULER_NAME = "raylight-scheduler"


class Scheduler:
    """The actor's class (``start`` makes it a Ray actor); every method returns plain data."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S, cloud: dict[str, Any] | None = None) -> None:
        self.state = SchedulerState(alive_nodes, stale_after_s=stale_after_s)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.cloud = None
        if cloud is not None:
            from raylight.scheduler.cloud import CloudConfig, CloudScaler

            self.cloud = CloudScaler(self.state, CloudConfig.of(cloud))
            threading.Thread(target=self._plan, name="raylight-scheduler-cloud", daemon=True).start()

    def _plan(self) -> None:
        assert self.cloud is not None
        while not self._done.is_set():
            with self._lock:
                try:
                    self.cloud.step()
                    self.cloud.error = ""
                except Exception as exc:  # the next plan tries again; the status says why
                    self.cloud.error = f"{type(exc).__name__}: {exc}"
                    log.warning("raylight scheduler, cloud mode: the plan failed: %s", self.cloud.error)
            self._done.wait(self.cloud.config.interval_s)

    def register(self, job_id: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            return self.state.register(job_id, **fields)

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any]:
        with self._lock:
            return self.state.report(job_id, model, **fields)

    def unregister(self, job_id: str) -> None:
        with self._lock:
            self.state.unregister(job_id)

    def status(self) -> dict[str, Any]:
        with self._lock:
            out = self.state.status()
            if self.cloud is not None:
                out["cloud"] = self.cloud.status()
            return out

    def withdraw(self) -> bool:
        """Cloud mode ends (the scheduler stops): no more plans, the request withdrawn."""
        self._done.set()
        with self._lock:
            if self.cloud is None:
                return False
            self.cloud.withdraw()
            return True

    def allocation_history(self) -> list[dict[str, Any]]:
        return self.state.allocation_history()

    def ping(self) -> bool:
        return True


START_TIMEOUT_S = 60.0  # start(timeout_s=): from asking Ray for the actor to its first answer
WITHDRAW_TIMEOUT_S = 10.0  # stop(): for cloud mode to withdraw its request before the actor is killed


def start(
    *, stale_after_s: float = STALE_AFTER_S, timeout_s: float = START_TIMEOUT_S, cloud: dict[str, Any] | None = None,
) -> Any:
    """The scheduler's handle on the connected cluster, started if it is not running
    (``cloud``: cloud mode's settings, ``raylight.scheduler.cloud.CloudConfig.of``; checked here
    first, so a bad one is the caller's error, not a dead actor's)."""
    if cloud is not None:
        from raylight.scheduler.cloud import CloudConfig

        CloudConfig.of(cloud)
    actor: Any = ray.remote(Scheduler)
    handle = actor.options(
        name=SCHEDULER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_concurrency=1,
    ).remote(stale_after_s, cloud)
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
    try:  # cloud mode's request is the cluster's: withdrawn before the actor goes
        ray.get(handle.withdraw.remote(), timeout=WITHDRAW_TIMEOUT_S)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
        log.warning("the raylight scheduler did not withdraw its autoscaler request within WITHDRAW_TIMEOUT_S=%g s (%s); "
                    "clear it with ray.autoscaler.sdk.request_resources(bundles=[])", WITHDRAW_TIMEOUT_S, type(exc).__name__)
    ray.kill(handle, no_restart=True)
    return True

"""Warm worker processes kept for the life of the driver and reused by the next run.

A new worker is a new process that imports torch, Ray and the user's libraries: seconds,
on every ``fit``, every Lightning ``fit/validate/test`` and every Tune trial. A run that
ends cleanly hands its workers to this pool instead of killing them, and the next run on
the same node, with the same worker runtime environment and strategy, takes them.

- Idle workers hold no Ray resources: pooled workers run as zero-CPU actors pinned to
  their node, and while they train the run's placement group bundle accounts for them
  (``ScalingConfig.reuse_workers``). GPU workers are not pooled: Ray binds a GPU to an
  actor when it is created.
- Which processes come back is the worker's own decision when its run ends
  (``RaylightWorker.release``): only a loop that finished, under a strategy that keeps no
  process-wide state once its group is gone (DDP, FSDP, DeepSpeed, or none), that left no threads or child processes running; its
  environment variables, torch's default dtype and RNG are put back as a new process has
  them. A worker whose user modules changed on disk since it imported them (a notebook
  user edited them) is not reused. Everything else is killed, as before.
- Idle workers are killed after ``ScalingConfig.idle_worker_timeout_s`` (a timer thread in
  the driver), when the driver exits, and by ``raylight.release_workers()``; at most
  ``MAX_IDLE`` are kept (the oldest go first).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from raylight.base.clock import monotonic

log = logging.getLogger("raylight")

MAX_IDLE = 8  # idle processes kept at most, over all nodes (each holds torch in memory)


@dataclass
class Idle:
    actor: Any
    node: dict[str, Any]  # the worker's node_info (ip, node_id, pid, ...)
    key: str  # the worker runtime environment it was started with
    expires: float  # monotonic time it is killed at, unless taken first

    def serves(self, node_id: str, key: str, now: float) -> bool:
        return self.key == key and self.node.get("node_id") == node_id and self.expires > now


def pool_key(runtime_env: dict[str, Any] | None, strategy: str) -> str:
    """Which idle workers a run may take: started with its runtime environment, and last
    run under its strategy (a sharded strategy leaves malloc tuned for its buffers)."""
    return json.dumps({"runtime_env": runtime_env or {}, "strategy": strategy}, sort_keys=True)


def _cluster() -> str | None:
    import ray

    if not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # a Ray Client driver: no GCS address
        return "client"


def kill_quietly(actor: Any) -> None:
    """``ray.kill`` that ignores an actor already gone, or a Ray shutting down."""
    import ray

    with contextlib.suppress(Exception):  # already gone, or Ray is shutting down
        ray.kill(actor, no_restart=True)


class WorkerPool:
    """Idle workers by node and runtime environment; thread-safe (its timer reaps)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[Idle] = []
        self._cluster: str | None = None
        self._timer: threading.Timer | None = None
        self._exit_hook = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)

    def take(self, node_id: str, key: str) -> Idle | None:
        """An idle worker on ``node_id`` started with runtime environment ``key``, in the
        order they were put (a run's workers come back in rank order)."""
        with self._lock:
            self._forget_other_cluster()
            now = monotonic()
            for i, idle in enumerate(self._idle):
                if idle.serves(node_id, key, now):
                    del self._idle[i]
                    return idle
        return None

    def count(self, node_id: str, key: str) -> int:
        """Idle workers ``take`` could give for ``node_id`` and ``key`` now."""
        with self._lock:
            self._forget_other_cluster()
            now = monotonic()
            return sum(1 for idle in self._idle if idle.serves(node_id, key, now))

    def put(self, actor: Any, node: dict[str, Any], key: str, idle_s: float) -> None:
        evicted: list[Any] = []
        with self._lock:
            self._forget_other_cluster()
            self._cluster = _cluster()
            self._idle.append(Idle(actor, node, key, monotonic() + idle_s))
            while len(self._idle) > MAX_IDLE:
                evicted.append(self._idle.pop(0).actor)
            self._schedule()
            if not self._exit_hook:  # runs before the embedded runtime's ray.shutdown
                atexit.register(self.clear)
                self._exit_hook = True
        for actor in evicted:
            kill_quietly(actor)

    def clear(self) -> int:
        """Kill every idle worker now; returns how many there were."""
        with self._lock:
            idle, self._idle = self._idle, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        here = _cluster()
        if here is not None and here == self._cluster:
            for entry in idle:
                kill_quietly(entry.actor)
        return len(idle)

    def _forget_other_cluster(self) -> None:
        """Handles from a Ray this process has since shut down (or left) mean nothing now."""
        if self._idle and _cluster() != self._cluster:
            self._idle = []

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._idle:
            return
        delay = max(0.0, min(i.expires for i in self._idle) - monotonic())
        self._timer = threading.Timer(delay, self._reap)
        self._timer.daemon = True
        self._timer.start()

    def _reap(self) -> None:
        with self._lock:
            now = monotonic()
            expired = [i for i in self._idle if i.expires <= now]
            self._idle = [i for i in self._idle if i.expires > now]
            same = _cluster() == self._cluster
            self._schedule()
        if same:
            for entry in expired:
                kill_quietly(entry.actor)
        if expired:
            log.debug("killed %d idle worker(s) after their idle timeout", len(expired))


POOL = WorkerPool()


def release_workers() -> int:
    """Kill the idle worker processes raylight keeps for the next run of this driver
    (they would go on their own after ``ScalingConfig.idle_worker_timeout_s``, or when the
    driver exits). Returns how many were killed."""
    return POOL.clear()

"""Warm processes: the spare beside rank 0, and workers kept for the next run.

- The warm spare (``ScalingConfig.warm_spare``): an elastic CPU group below its maximum
  keeps one idle process on rank 0's node, started once rank 0 trains and warmed with
  its modules; a grow whose bundle lands on that node takes it instead of a new process.
  ``WarmSpare`` holds it and decides when it starts, is taken and goes; the worker group
  creates the process.
- The pool (``pool.py``): a run that ended cleanly hands the workers that say they can
  serve again to it (``hand_to_pool``), and ``prestart_workers`` puts still-starting
  workers of a run's shape there before the run asks for them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group_table,
)

from raylight.base.exceptions import WorkerStartError
from raylight.config import ScalingConfig
from raylight.worker.session import RankInfo
from raylight.worker.strategies.base import worker_env
from raylight.worker_group.placement import driver_node, pinned_worker
from raylight.worker_group.pool import POOL, kill_quietly, pool_key

log = logging.getLogger("raylight")

RELEASE_WAIT_S = 5.0  # how long a clean shutdown waits for workers to say they can be reused


@dataclass
class Spare:
    """A pre-started worker process beside rank 0, with no Ray resources of its own: when
    the group grows and a bundle it reserves lands on this node, the spare joins in that
    bundle's place (the bundle's reservation accounts for it) instead of a new process."""

    actor: Any
    node_id: str
    refs: list[Any]  # [node_info, warm]
    ready: bool = False


class WarmSpare:
    """A worker group's spare: none, or one ``Spare``."""

    def __init__(self) -> None:
        self.spare: Spare | None = None

    @property
    def ready(self) -> bool:
        return self.spare is not None and self.spare.ready

    def tend(self, *, wanted: bool, rank0_trains: bool, start: Callable[[], Spare]) -> None:
        """Start the spare (``start()``) once rank 0 trains (so it has imported what the
        loop needs); drop it when it is no longer ``wanted`` (the group cannot grow)."""
        if not wanted:
            if self.spare is None or self.created():
                self.drop()
            return  # else dropped on a later poll, once Ray has created it
        spare = self.spare
        if spare is not None and not spare.ready:
            done, _ = ray.wait(spare.refs, num_returns=len(spare.refs), timeout=0)
            spare.ready = len(done) == len(spare.refs)
        if spare is not None or not rank0_trains:
            return
        self.spare = start()

    def take(self, slots: list[tuple[PlacementGroup, int]], wait: Callable[[list[Any]], Any]) -> tuple[int, Spare | None]:
        """The slot (index into ``slots``) on the spare's node, and the spare, ready
        (``wait(refs)`` raises WorkerStartError when it is not); (-1, None) when there is
        no usable spare."""
        spare = self.spare
        if spare is None:
            return -1, None
        nodes = [placement_group_table(pg).get("bundles_to_node_id", {}).get(b) for pg, b in slots]
        if spare.node_id not in nodes:
            return -1, None
        at = nodes.index(spare.node_id)
        self.spare = None
        try:  # normally long ready; if not, it is still ahead of a new process
            wait(spare.refs)
        except WorkerStartError as exc:
            log.warning("the warm spare is not usable (%s); starting a new worker", exc)
            kill_quietly(spare.actor)
            return -1, None
        return at, spare

    def created(self, timeout: float = 0.0) -> bool:
        """Whether Ray has done creating the spare (its first call answered, or failed),
        waiting up to ``timeout`` s. Killing an actor while Ray still grants it a worker
        makes Ray's GCS log "Failed to kill actor NIL_ID", a line Ray forwards to the
        driver's console. A spare holds no resources, so it can wait a poll or two for its
        process."""
        assert self.spare is not None
        done, _ = ray.wait(self.spare.refs[:1], timeout=timeout)
        return bool(done)

    def drop(self) -> None:
        if self.spare is not None:
            kill_quietly(self.spare.actor)
            self.spare = None


def hand_to_pool(
    finished: list[tuple[Any, dict[str, Any]]], spare: WarmSpare, *, home: str | None, key: str, idle_s: float
) -> set[int]:
    """Hand ``finished`` (each an actor whose loop finished on this driver's node
    ``home``, and its node_info) and a spare on ``home`` to the pool, where each one says
    it can serve another run; returns the ids of the actors pooled."""
    candidates = list(finished)
    held = spare.spare
    if held is not None and held.node_id == home:  # started, perhaps still importing: it never ran a loop
        with contextlib.suppress(Exception):
            candidates.append((held.actor, ray.get(held.refs[0], timeout=0)))
    if not candidates:
        return set()
    refs = [actor.release.remote() for actor, _ in candidates]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RELEASE_WAIT_S)
    pooled: set[int] = set()
    for (actor, node), ref in zip(candidates, refs, strict=True):
        try:
            why = ray.get(ref, timeout=0) if ref in ready else "it did not answer"
        except RayError as exc:
            why = str(exc).splitlines()[0]
        if why is None:
            POOL.put(actor, node, key, idle_s)
            pooled.add(id(actor))
            if held is not None and actor is held.actor:
                spare.spare = None
        else:
            log.debug("not keeping worker %s for the next run: %s", node.get("pid"), why)
    return pooled


def worker_runtime_env(scaling: ScalingConfig) -> dict[str, Any] | None:
    """The workers' own runtime_env: environment variables their strategy wants at
    process start (merged by Ray into the job's ``env_vars``), else None."""
    env = worker_env(scaling.process_kind, scaling.use_gpu)
    return {"env_vars": env} if env else None


def prestart_workers(scaling: ScalingConfig, *, modules: tuple[str, ...] = ()) -> int:
    """Start the first workers of a run of ``scaling``'s shape now, as idle pooled workers
    on this driver's node, and return at once; the run's start takes them from the pool.
    Their processes start and import torch (and ``modules``) while the driver is still
    busy (the declarative backend's preprocessing). Returns how many it started: none
    where workers are not pooled (GPU workers, ``reuse_workers=False``), where the pool
    already holds them, or where this node cannot hold the run's first workers (they would
    be placed elsewhere and sit idle until ``idle_worker_timeout_s``)."""
    node_id = driver_node()
    if not scaling.reuse_workers or scaling.use_gpu or node_id is None or get_current_placement_group() is not None:
        return 0
    count = scaling.min_workers
    per_worker = scaling.worker_resources()
    here: dict[str, float] = next((n.get("Resources", {}) for n in ray.nodes() if n.get("NodeID") == node_id and n.get("Alive")), {})
    if any(here.get(k, 0.0) < v * count for k, v in per_worker.items()):
        return 0
    runtime_env = worker_runtime_env(scaling)
    key = pool_key(runtime_env, scaling.process_kind)
    started = 0
    for _ in range(count - POOL.count(node_id, key)):
        actor = pinned_worker(node_id, runtime_env, RankInfo(0, 0, count, 1, 0), "prestarted")  # begin_run gives it its run's
        if modules:
            actor.warm.remote(None, list(modules))
        POOL.put(actor, {"node_id": node_id}, key, scaling.idle_worker_timeout_s)
        started += 1
    return started

"""The scheduler's bookkeeping, with no Ray: jobs, their models as plain data, allocations.

A job registers (fixed or adaptive, min/max workers, weight, resources per worker), then
reports its goodput model at each adaptive decision as plain data (lists and dicts of
numbers: no pickled objects from jobs cross into the scheduler)::

    {"perf": [alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma],
     "grad": [sqr, var], "init_batch_size": M0, "max_batch_size": M_max,
     "atomic_bsz_range": [lo, hi], "accumulation": bool,
     "nodes": [node id of each worker], "resize_cost_s": seconds}

Every answer is the job's allocation: ``{"workers": n, "nodes": [node ids], "atomic_bsz",
"accum_steps", "speedup", "waiting": why it has none}``. A job that sends nothing for
``stale_after_s`` is dropped and its slots freed. Nothing here survives the actor: a
restarted scheduler learns its jobs again from their next reports (a report from an
unknown job registers it, since a report carries every registration field).

Slots: a node's slots are its amount of the jobs' resource (GPU when any job asks for
GPUs, else CPU) divided by the largest amount one worker of any job asks for, so an
allocation never asks more of a node than it has. Resources held by work that is not
registered are not seen.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams
from raylight.adaptive.sharing import Allocation, JobModel, SharingPolicy
from raylight.base.clock import monotonic

# A job reports at each adaptive decision (every few seconds): one silent for this long
# has ended without unregistering (its driver died) and its slots go to the others.
STALE_AFTER_S = 60.0

_REGISTRATION = ("fixed", "min_workers", "max_workers", "weight", "resources")


@dataclass
class JobEntry:
    job_id: str
    fixed: bool
    min_workers: int
    max_workers: int
    weight: float
    resources: dict[str, float]
    seen: float
    model: dict[str, Any] = field(default_factory=dict)


def _registration(job_id: str, fields: dict[str, Any], now: float) -> JobEntry:
    try:
        entry = JobEntry(
            job_id=str(job_id), fixed=bool(fields.get("fixed", False)),
            min_workers=int(fields.get("min_workers", 1)), max_workers=int(fields.get("max_workers", fields.get("min_workers", 1))),
            weight=float(fields.get("weight", 1.0)),
            resources={str(k): float(v) for k, v in (fields.get("resources") or {"CPU": 1.0}).items()}, seen=now,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id!r}: a registration field is not a number: {exc}") from None
    if entry.min_workers < 1 or entry.max_workers < entry.min_workers:
        raise ValueError(
            f"job {job_id!r}: workers must satisfy 1 <= min_workers <= max_workers, got "
            f"{entry.min_workers}, {entry.max_workers}"
        )
    if not (entry.weight > 0 and math.isfinite(entry.weight)):
        raise ValueError(f"job {job_id!r}: weight must be a positive number, got {entry.weight}")
    return entry


def _goodput(model: dict[str, Any]) -> GoodputFunction | None:
    if not model.get("perf") or not model.get("grad"):
        return None  # not fitted yet
    return GoodputFunction(
        PerfParams(*(float(x) for x in model["perf"])), GradParams(*(float(x) for x in model["grad"])),
        int(model.get("init_batch_size", 1)),
    )


class SchedulerState:
    """Registered jobs and the allocation over nodes ``nodes()`` returns ({node id: resources})."""

    def __init__(
        self,
        nodes: Callable[[], dict[str, dict[str, float]]],
        *,
        stale_after_s: float = STALE_AFTER_S,
        policy: SharingPolicy | None = None,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s}")
        self._nodes = nodes
        self.stale_after_s = stale_after_s
        self.policy = policy or SharingPolicy()
        self._clock = clock
        self.jobs: dict[str, JobEntry] = {}  # in arrival order: first come, first served
        self.last: Allocation | None = None
        self._node_ids: list[str] = []
        self.dropped: list[str] = []

    # -- the protocol ------------------------------------------------------------------
    def register(self, job_id: str, **fields: Any) -> dict[str, Any]:
        entry = _registration(job_id, fields, self._clock())
        old = self.jobs.pop(entry.job_id, None)
        if old is not None:
            entry.model = old.model
        self.jobs[entry.job_id] = entry
        return self._answer(entry.job_id)

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any]:
        if job_id not in self.jobs:  # a restarted scheduler learns the job again
            self.jobs[job_id] = _registration(job_id, fields, self._clock())
        entry = self.jobs[job_id]
        _goodput(model)  # refuse a malformed model here, not at the next allocation
        entry.model, entry.seen = dict(model), self._clock()
        return self._answer(job_id)

    def unregister(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.last = None

    def status(self) -> dict[str, Any]:
        alloc = self.allocate()
        jobs = []
        for job_id, entry in self.jobs.items():
            share = alloc.jobs.get(job_id)
            jobs.append({
                "job_id": job_id, "fixed": entry.fixed, "min_workers": entry.min_workers,
                "max_workers": entry.max_workers, "weight": entry.weight, "resources": entry.resources,
                "workers": share.replicas if share else 0, "nodes": self._ids(share.nodes) if share else [],
                "speedup": share.speedup if share else 0.0, "goodput": self._goodput_of(entry, share),
                "waiting": self._waiting(share.waiting) if share else "",
                "seconds_since_report": round(self._clock() - entry.seen, 3),
            })
        return {"jobs": jobs, "fitness": alloc.fitness, "nodes": self._slots(), "dropped": list(self.dropped)}

    # -- allocating --------------------------------------------------------------------
    def expire(self) -> list[str]:
        now = self._clock()
        gone = [j for j, e in self.jobs.items() if now - e.seen > self.stale_after_s]
        for job_id in gone:
            del self.jobs[job_id]
        self.dropped.extend(gone)
        return gone

    def allocate(self) -> Allocation:
        self.expire()
        slots = self._slots()
        self._node_ids = list(slots)
        index = {node: i for i, node in enumerate(self._node_ids)}
        models = [self._job_model(e, index) for e in self.jobs.values()]
        self.last = self.policy.allocate(models, list(slots.values()))
        return self.last

    def _answer(self, job_id: str) -> dict[str, Any]:
        share = self.allocate().jobs[job_id]
        return {
            "workers": share.replicas, "nodes": self._ids(share.nodes), "atomic_bsz": share.atomic_bsz,
            "accum_steps": share.accum_steps, "speedup": share.speedup, "waiting": self._waiting(share.waiting),
        }

    def _job_model(self, entry: JobEntry, index: dict[str, int]) -> JobModel:
        model = entry.model
        current = tuple(index[n] for n in model.get("nodes", []) if n in index)
        goodput = None if entry.fixed else _goodput(model)
        if goodput is None:
            # Fixed, or adaptive with no fitted model yet: it keeps its size (its minimum
            # when it has not started) until its model says what more would be worth.
            size = entry.min_workers if entry.fixed or not current else min(max(len(current), entry.min_workers), entry.max_workers)
            return JobModel(entry.job_id, None, min_replicas=size, weight=entry.weight, current=current)
        bsz = model.get("atomic_bsz_range")
        return JobModel(
            entry.job_id, goodput, min_replicas=entry.min_workers, max_replicas=entry.max_workers,
            weight=entry.weight, max_batch_size=model.get("max_batch_size"),
            atomic_bsz_range=(int(bsz[0]), int(bsz[1])) if bsz else None,
            accumulation=bool(model.get("accumulation", False)), current=current,
            resize_cost_s=float(model.get("resize_cost_s", 1.0)),
        )

    def _resource(self) -> str:
        return "GPU" if any(e.resources.get("GPU", 0) > 0 for e in self.jobs.values()) else "CPU"

    def _slots(self) -> dict[str, int]:
        """Slots per node id, in a stable order (see the module docstring)."""
        return {node: self.slots_of(res) for node, res in sorted(self._nodes().items())}

    def slots_of(self, resources: dict[str, float]) -> int:
        """The slots of a node of ``resources`` (one that is there, or one cloud mode may ask for)."""
        key = self._resource()
        per_worker = max((e.resources.get(key, 0.0) for e in self.jobs.values()), default=1.0) or 1.0
        return int(resources.get(key, 0.0) // per_worker + 1e-9)

    def job_models(self, node_ids: list[str]) -> list[JobModel]:
        """The jobs' models (arrival order) with their replicas indexed into ``node_ids``
        (cloud mode plans on these nodes and some not there yet)."""
        self.expire()
        index = {node: i for i, node in enumerate(node_ids)}
        return [self._job_model(e, index) for e in self.jobs.values()]

    def _ids(self, nodes: tuple[int, ...]) -> list[str]:
        return [self._node_ids[i] for i in nodes]

    def _waiting(self, reason: str) -> str:
        return reason.replace("slot(s)", f"{self._resource()} slot(s)").replace("held by", "held by runs")

    def _goodput_of(self, entry: JobEntry, share: Any) -> float | None:
        goodput = None if entry.fixed else _goodput(entry.model)
        if goodput is None or share is None or share.replicas == 0:
            return None
        return float(goodput(len(set(share.nodes)), share.replicas, max(share.atomic_bsz, 1), share.accum_steps))

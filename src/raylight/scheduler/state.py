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

Hand-over and holds (issue 58's real-run faults): a job is told growth only into slots
no other job holds or was promised (``handover.py``), and a job whose resize is in flight
(its report does not show the count it was told yet, for at most ``resize_wait_s``) or
that resized less than ``min_hold_s`` ago keeps its allocation: the policy sees it
frozen. Each change of what a job is told is kept in ``history`` (``allocation_history``:
the workers per job over time that ``raylight scheduler status --plot`` draws).

Slots: a node's slots are its amount of the jobs' resource (GPU when any job asks for
GPUs, else CPU) divided by the largest amount one worker of any job asks for, so an
allocation never asks more of a node than it has. Resources held by work that is not
registered are not seen.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams
from raylight.adaptive.sharing import Allocation, JobModel, SharingPolicy
from raylight.base.clock import monotonic
from raylight.scheduler.handover import Holding, grant, waiting_reason

# A job reports at each adaptive decision (every few seconds): one silent for this long
# has ended without unregistering (its driver died) and its slots go to the others.
STALE_AFTER_S = 60.0
# A job told a new count is frozen there until its report shows it (a resize in flight),
# for at most this long: one that never gets there (it could not) is free to move again.
RESIZE_WAIT_S = 120.0
# After a resize, a job keeps its allocation at least this long: a resize costs 16-54 s on
# a loaded machine, and a share changed again at once pays that again for nothing.
MIN_HOLD_S = 30.0
# Changes of allocation kept for `raylight scheduler status --plot`.
HISTORY_ROWS = 10_000

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
    told: tuple[str, ...] | None = None  # the nodes it was last told (None: never told)
    told_at: float = 0.0
    settled_at: float | None = None  # when its report first showed the count it was told
    resized: bool = False  # the last change of its told count was from a running size

    @property
    def held(self) -> tuple[str, ...]:
        """The node of each worker its last report says it runs."""
        return tuple(str(n) for n in self.model.get("nodes", []))

    def in_flight(self, now: float, wait_s: float) -> bool:
        return self.told is not None and len(self.held) != len(self.told) and now - self.told_at < wait_s


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
        resize_wait_s: float = RESIZE_WAIT_S,
        min_hold_s: float = MIN_HOLD_S,
        policy: SharingPolicy | None = None,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        for name, value in (("stale_after_s", stale_after_s), ("resize_wait_s", resize_wait_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not min_hold_s >= 0:
            raise ValueError(f"min_hold_s must be >= 0 (0: no hold after a resize), got {min_hold_s}")
        self._nodes = nodes
        self.stale_after_s = stale_after_s
        self.resize_wait_s = resize_wait_s
        self.min_hold_s = min_hold_s
        self.policy = policy or SharingPolicy()
        self._clock = clock
        self.jobs: dict[str, JobEntry] = {}  # in arrival order: first come, first served
        self.last: Allocation | None = None
        self._node_ids: list[str] = []
        self.dropped: list[str] = []
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_ROWS)

    # -- the protocol ------------------------------------------------------------------
    def register(self, job_id: str, **fields: Any) -> dict[str, Any]:
        entry = _registration(job_id, fields, self._clock())
        old = self.jobs.pop(entry.job_id, None)
        if old is not None:
            entry.model, entry.told, entry.told_at = old.model, old.told, old.told_at
            entry.settled_at, entry.resized = old.settled_at, old.resized
        self.jobs[entry.job_id] = entry
        return self._answer(entry.job_id)

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any]:
        if job_id not in self.jobs:  # a restarted scheduler learns the job again
            self.jobs[job_id] = _registration(job_id, fields, self._clock())
        entry = self.jobs[job_id]
        _goodput(model)  # refuse a malformed model here, not at the next allocation
        entry.model, entry.seen = dict(model), self._clock()
        if entry.told is not None and entry.settled_at is None and len(entry.held) == len(entry.told):
            entry.settled_at = entry.seen  # the resize it was told is done
        return self._answer(job_id)

    def unregister(self, job_id: str) -> None:
        if self.jobs.pop(job_id, None) is not None:
            self._record(job_id, 0)
        self.last = None

    def status(self) -> dict[str, Any]:
        alloc = self.allocate()
        jobs = []
        for job_id, entry in self.jobs.items():
            share = alloc.jobs.get(job_id)
            told = self._tell(job_id, alloc, commit=False)
            jobs.append({
                "job_id": job_id, "fixed": entry.fixed, "min_workers": entry.min_workers,
                "max_workers": entry.max_workers, "weight": entry.weight, "resources": entry.resources,
                "workers": told["workers"], "nodes": told["nodes"], "target": told["target"],
                "held": len(entry.held), "pending": told["pending"],
                "speedup": share.speedup if share else 0.0, "goodput": self._goodput_of(entry, share),
                "waiting": told["waiting"], "frozen": self._frozen(entry),
                "seconds_since_report": round(self._clock() - entry.seen, 3),
            })
        return {"jobs": jobs, "fitness": alloc.fitness, "nodes": self._slots(), "dropped": list(self.dropped)}

    def allocation_history(self) -> list[dict[str, Any]]:
        """Each change of a job's told worker count: ``{"t", "job_id", "workers"}`` (t on the scheduler's clock)."""
        return list(self.history)

    # -- allocating --------------------------------------------------------------------
    def expire(self) -> list[str]:
        now = self._clock()
        gone = [j for j, e in self.jobs.items() if now - e.seen > self.stale_after_s]
        for job_id in gone:
            del self.jobs[job_id]
            self._record(job_id, 0)
        self.dropped.extend(gone)
        return gone

    def allocate(self) -> Allocation:
        """The policy's allocation now: the target every answer moves towards."""
        self.expire()
        slots = self._slots()
        self._node_ids = list(slots)
        index = {node: i for i, node in enumerate(self._node_ids)}
        models = [self._job_model(e, index) for e in self.jobs.values()]
        alloc = self.policy.allocate(models, list(slots.values()))
        if any(a.waiting for a in alloc.jobs.values()) and any(self._held(e) for e in self.jobs.values()):
            # A hold keeps a share from moving for a small gain, not a waiting job out:
            # the held jobs may shrink to admit it (a resize in flight still may not).
            models = [self._job_model(e, index, hold=False) for e in self.jobs.values()]
            alloc = self.policy.allocate(models, list(slots.values()))
        self.last = alloc
        return alloc

    def _answer(self, job_id: str) -> dict[str, Any]:
        return self._tell(job_id, self.allocate(), commit=True)

    def _tell(self, job_id: str, alloc: Allocation, *, commit: bool) -> dict[str, Any]:
        """What the job may be told now (``handover.py``); ``commit``: it is told (a promise)."""
        holdings = {
            j: Holding(e.held, e.told, tuple(self._ids(alloc.jobs[j].nodes)), e.min_workers)
            for j, e in self.jobs.items()
        }
        share, entry = alloc.jobs[job_id], self.jobs[job_id]
        given = grant(job_id, holdings, sum(self._slots().values()))
        waiting = self._waiting(share.waiting) if share.waiting else ""
        short = len(given.nodes) < share.replicas
        if short and not given.nodes and not waiting:
            waiting = waiting_reason(share.replicas, given.waiting_on, self._resource())
        pending = (
            f"growing to {share.replicas} when runs {', '.join(given.waiting_on) or 'before it'} let go of their slots"
            if short and given.nodes else ""
        )
        if commit:
            self._commit(entry, given.nodes)
        return {
            "workers": len(given.nodes), "nodes": list(given.nodes), "atomic_bsz": share.atomic_bsz,
            "accum_steps": share.accum_steps, "speedup": share.speedup, "waiting": waiting,
            "target": share.replicas, "pending": pending,
        }

    def _commit(self, entry: JobEntry, nodes: tuple[str, ...]) -> None:
        if entry.told is None or len(entry.told) != len(nodes):
            entry.resized = bool(entry.told)  # a running size changed (not a first start)
            entry.told_at = self._clock()
            entry.settled_at = self._clock() if len(entry.held) == len(nodes) else None
            self._record(entry.job_id, len(nodes))
        entry.told = nodes

    def _record(self, job_id: str, workers: int) -> None:
        self.history.append({"t": round(self._clock(), 3), "job_id": job_id, "workers": workers})

    def _frozen(self, entry: JobEntry, *, hold: bool = True) -> bool:
        """Its allocation stays: a resize of it in flight, or (``hold``) done less than min_hold_s ago."""
        if entry.in_flight(self._clock(), self.resize_wait_s):
            return bool(entry.told)
        return hold and self._held(entry)

    def _held(self, entry: JobEntry) -> bool:
        """Within min_hold_s of the first report at the size a resize gave it."""
        settled = entry.settled_at
        return entry.resized and settled is not None and self._clock() - settled < self.min_hold_s

    def _job_model(self, entry: JobEntry, index: dict[str, int], *, hold: bool = True) -> JobModel:
        model = entry.model
        frozen = self._frozen(entry, hold=hold)
        nodes = entry.told if frozen and entry.told else entry.held
        current = tuple(index[n] for n in nodes if n in index)
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
            resize_cost_s=float(model.get("resize_cost_s", 1.0)), frozen=frozen and bool(current),
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

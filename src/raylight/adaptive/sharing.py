"""Sharing one cluster among many jobs by their goodput (Pollux's cluster half), pure.

Each job brings its own goodput model (``GoodputFunction``: throughput parameters and
gradient noise) or a fixed size. The policy gives every job a number of replicas and the
nodes they sit on, maximising the cluster's fitness (Pollux, OSDI'21)::

    SPEEDUP_j(A)  = best goodput of job j with allocation A
                    / best goodput of job j at its minimum (packed on one node)
    FITNESS_p     = (sum_j w_j SPEEDUP_j^p / sum_j w_j) ^ (1/p)      p < 0: fair, p = 1: sum

The paper's speedup is relative to a fair share; by default (``baseline="min"``) raylight
takes it relative to the job's smallest allocation (one replica for most), which does not
depend on the other jobs, so an arriving job never raises another's allocation. With
``baseline="fair"`` it is relative to the job's goodput on a fair share of the slots
(ceil(total / admitted jobs) replicas, packed), as in the paper: with p < 0 that weighs
each job by how well it uses a fair share (SPEEDUP_j^p = (G_j / G_j(min))^p *
(G_j(fair) / G_j(min))^-p), so the slots go more to the jobs that scale. On Pollux's
workload 6 (bench/scheduler.py, one run) it gave a lower average JCT, 3,158 s against 3,218 s. With p = -1 (the
default, Pollux's), a job's slots go where they raise the harmonic mean
of speedups most, so no job is starved for another's throughput. A job whose allocation
would change is charged its resize cost over the scheduling horizon (raylight resizes in
place in well under a second, so the charge is small, but it keeps the policy from
moving jobs for a 1% gain). The batch size is chosen with the replicas: the goodput
model's ``optimize`` picks the best batch for each candidate size.

The search is greedy on the marginal fitness per slot, looking ahead over every size a
job could grow to (goodput is not concave across a node boundary), then a placement packs
each job on as few nodes as it can, keeping replicas where they already run. That takes
milliseconds for 100 jobs on 100 nodes (Pollux's genetic search takes seconds to minutes).

Fixed-size jobs get their size or wait; jobs are admitted first come first served while
their minimums fit, and a job that cannot start says what holds the slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from raylight.adaptive.goodput import GoodputFunction


@dataclass(frozen=True)
class JobModel:
    """What one job tells the scheduler.

    ``goodput`` None is a fixed-size job: it runs at exactly ``min_replicas``.
    ``current`` is where its replicas run now (node index per replica), empty when it
    has not started; ``resize_cost_s`` is what a change of allocation costs it (the
    job's measured seconds from a resize decision to its first step at the new size).
    ``frozen``: its count stays ``len(current)`` whatever the others' models say (a resize
    of it is in flight, or it is held after one: ``raylight.scheduler.state``).
    """

    name: str
    goodput: GoodputFunction | None = None
    min_replicas: int = 1
    max_replicas: int | None = None
    weight: float = 1.0
    max_batch_size: int | None = None
    atomic_bsz_range: tuple[int, int] | None = None
    accumulation: bool = False
    current: tuple[int, ...] = ()
    resize_cost_s: float = 1.0
    frozen: bool = False

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise ValueError(
                f"job {self.name!r}: min_replicas must be >= 1, got {self.min_replicas}"
            )
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"job {self.name!r}: max_replicas {self.max_replicas} < min_replicas {self.min_replicas}"
            )
        if not self.weight > 0 or not math.isfinite(self.weight):
            raise ValueError(
                f"job {self.name!r}: weight must be a positive number, got {self.weight}"
            )
        if self.frozen and not self.current:
            raise ValueError(f"job {self.name!r}: frozen needs current (the replicas it keeps)")
        if not self.resize_cost_s >= 0 or not math.isfinite(self.resize_cost_s):
            raise ValueError(
                f"job {self.name!r}: resize_cost_s must be a number of seconds >= 0, got {self.resize_cost_s}"
            )

    @property
    def need(self) -> int:
        """The replicas it must have to run: its minimum, or its count while frozen."""
        return len(self.current) if self.frozen else self.min_replicas

    @property
    def fixed(self) -> bool:
        return self.goodput is None


@dataclass(frozen=True)
class JobAllocation:
    """A job's share: ``nodes[i]`` is the node of replica i (empty: the job waits)."""

    name: str
    nodes: tuple[int, ...]
    speedup: float
    atomic_bsz: int = 0
    accum_steps: int = 0
    waiting: str = ""

    @property
    def replicas(self) -> int:
        return len(self.nodes)

    @property
    def num_nodes(self) -> int:
        return len(set(self.nodes))


@dataclass(frozen=True)
class Allocation:
    jobs: dict[str, JobAllocation]
    fitness: float
    free_slots: tuple[int, ...] = field(default=())

    def replicas(self) -> dict[str, int]:
        return {name: job.replicas for name, job in self.jobs.items()}


@dataclass(frozen=True)
class _Table:
    """One job's SPEEDUP(r), batch and accumulation for r = 0..total replicas."""

    speed: np.ndarray
    atomic: np.ndarray
    steps: np.ndarray
    base: float


class SharingPolicy:
    """Divides ``slots_per_node`` (GPUs or worker CPUs per node) among jobs.

    ``p`` is the power of the fitness mean (-1: Pollux's default), ``horizon_s`` the time
    over which a resize cost is charged (the scheduling interval's order).
    """

    def __init__(
        self, *, p: float = -1.0, horizon_s: float = 60.0, grid_size: int = 32, baseline: str = "min"
    ) -> None:
        if p == 0 or not math.isfinite(p):
            raise ValueError(
                f"p must be a finite non-zero number (-1: Pollux's fair mean), got {p}"
            )
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {horizon_s}")
        if baseline not in ("min", "fair"):
            raise ValueError(
                f"baseline must be 'min' (speedup over the job's minimum) or 'fair' (over a fair share), got {baseline!r}"
            )
        self.baseline = baseline
        self.p = p
        self.horizon_s = horizon_s
        self.grid_size = grid_size

    def allocate(self, jobs: Sequence[JobModel], slots_per_node: Sequence[int]) -> Allocation:
        """The allocation for ``jobs`` (in arrival order) on nodes of ``slots_per_node``."""
        names = [job.name for job in jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names must be unique, got {names}")
        slots = [int(s) for s in slots_per_node]
        if any(s < 0 for s in slots):
            raise ValueError(f"slots_per_node must be >= 0, got {slots}")
        total, per_node = sum(slots), max(slots, default=0)
        admitted, waiting = _admit(jobs, total)
        fair = max(1, math.ceil(total / max(len(admitted), 1)))
        tables = {job.name: self._speedups(job, total, per_node, fair) for job in admitted}
        counts = {job.name: job.need for job in admitted}
        self._grow(admitted, tables, counts, total - sum(counts.values()))
        placed = _place(admitted, counts, slots)
        result = {
            job.name: self._placed(job, tables[job.name], placed[job.name]) for job in admitted
        }
        for job, reason in waiting:
            result[job.name] = JobAllocation(job.name, (), 0.0, waiting=reason)
        free = list(slots)
        for alloc in result.values():
            for node in alloc.nodes:
                free[node] -= 1
        fitness = self._fitness([(job.weight, result[job.name].speedup) for job in admitted])
        return Allocation(result, fitness, tuple(free))

    # -- the speedup tables ------------------------------------------------------------

    def _speedups(self, job: JobModel, total: int, per_node: int, fair: int) -> _Table:
        """SPEEDUP_j(r) for r = 0..total replicas, r packed on ceil(r / per_node) nodes,
        over the job's goodput at its minimum (or, ``baseline="fair"``, at ``fair`` replicas).

        A resize away from the current count is charged ``resize_cost_s`` over ``horizon_s``.
        """
        r = np.arange(total + 1)
        if job.fixed:
            speed = np.where(r == job.min_replicas, 1.0, 0.0)
            return _Table(speed, np.zeros_like(r), np.zeros_like(r), 1.0)
        cap = total if job.max_replicas is None else min(job.max_replicas, total)
        good, atomic, steps = self._optimize(
            job, np.ceil(np.maximum(r, 1) / max(per_node, 1)), np.maximum(r, 1)
        )
        good = np.where((r >= job.min_replicas) & (r <= cap), good, 0.0)
        base_r = job.min_replicas if self.baseline == "min" else max(job.min_replicas, min(fair, cap))
        base = float(self._optimize(job, np.ceil(base_r / max(per_node, 1)), base_r)[0])
        base = base if base > 0 else max(float(good.max()), 1e-300)
        speed = good / base
        if job.current:
            speed = np.where(r != len(job.current), speed * (1 - self._penalty(job)), speed)
        return _Table(speed, atomic, steps, base)

    def _optimize(
        self, job: JobModel, nodes: object, replicas: object
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert job.goodput is not None
        good, atomic, steps = job.goodput.optimize(
            np.asarray(nodes),
            np.asarray(replicas),
            max_batch_size=job.max_batch_size,
            atomic_bsz_range=job.atomic_bsz_range,
            accumulation=job.accumulation,
            grid_size=self.grid_size,
        )
        return np.asarray(good, dtype=float), np.asarray(atomic), np.asarray(steps)

    def _penalty(self, job: JobModel) -> float:
        return min(job.resize_cost_s / self.horizon_s, 0.9)

    def _placed(self, job: JobModel, table: _Table, nodes: tuple[int, ...]) -> JobAllocation:
        """The job's allocation with its speedup on the nodes it was given (which may be
        more than the packed count the search assumed, when the free slots are scattered)."""
        r = len(nodes)
        if job.fixed or r == 0:
            return JobAllocation(job.name, nodes, float(table.speed[r]))
        good, atomic, steps = self._optimize(job, len(set(nodes)), r)
        speed = float(good) / table.base
        if job.current and r != len(job.current):
            speed *= 1 - self._penalty(job)
        return JobAllocation(job.name, nodes, speed, int(atomic), int(steps))

    # -- the search --------------------------------------------------------------------

    def _grow(
        self,
        jobs: Sequence[JobModel],
        tables: dict[str, _Table],
        counts: dict[str, int],
        free: int,
    ) -> None:
        """Give free slots to the job whose fitness gain per slot is largest, until none gains.

        With p < 0 the fitness rises as sum_j w_j s_j^p falls, with p > 0 as it rises; both
        are sums over jobs, so a step's gain is that job's term alone. A step may take any
        number of the free slots: goodput dips where a job first spans two nodes, and the
        step past the dip still wins when it pays per slot. Alone, a job so reaches the
        size of its best goodput (a step never jumps past the best size: the best size
        itself gains more per slot).
        """
        growable = [job for job in jobs if not (job.fixed or job.frozen)]
        if not growable:
            return
        terms = np.stack([self._term(tables[job.name].speed) for job in growable])
        weights = np.array([job.weight for job in growable]) * np.sign(self.p)
        have = np.array([counts[job.name] for job in growable])
        width = terms.shape[1]
        while free > 0:
            k = np.arange(1, min(free, width - 1) + 1)
            index = np.minimum(have[:, None] + k[None, :], width - 1)
            reach = (have[:, None] + k[None, :]) <= width - 1
            gain = (
                terms[np.arange(len(growable))[:, None], index]
                - terms[np.arange(len(growable)), have][:, None]
            )
            gain = np.where(reach, gain * weights[:, None] / k[None, :], -np.inf)
            row, col = (int(i) for i in np.unravel_index(int(np.argmax(gain)), gain.shape))
            if not gain[row, col] > 1e-12:
                break
            have[row] += col + 1
            free -= col + 1
        for grown, count in zip(growable, have, strict=True):
            counts[grown.name] = int(count)

    def _term(self, speed: np.ndarray | float) -> np.ndarray:
        s = np.maximum(np.asarray(speed, dtype=float), 1e-12)
        return np.asarray(s**self.p)

    def _fitness(self, weighted: list[tuple[float, float]]) -> float:
        if not weighted:
            return 0.0
        w = np.array([x for x, _ in weighted])
        s = np.array([y for _, y in weighted])
        if self.p < 0 and np.any(s <= 0):
            return 0.0
        return float((np.sum(w * s**self.p) / np.sum(w)) ** (1 / self.p))


def _admit(
    jobs: Sequence[JobModel], total: int
) -> tuple[list[JobModel], list[tuple[JobModel, str]]]:
    """First come first served while minimums fit; a job that does not fit waits, and says why."""
    admitted: list[JobModel] = []
    waiting: list[tuple[JobModel, str]] = []
    used = 0
    for job in jobs:
        if used + job.need <= total:
            admitted.append(job)
            used += job.need
            continue
        holders = ", ".join(j.name for j in admitted) or "nobody"
        waiting.append(
            (
                job,
                f"waiting for {job.min_replicas} slot(s): {total - used} of {total} free, held by {holders}",
            )
        )
    return admitted, waiting


def _place(
    jobs: Sequence[JobModel], counts: dict[str, int], slots: list[int]
) -> dict[str, tuple[int, ...]]:
    """Nodes for each job's replicas: where they run now when their count is unchanged,
    else on as few nodes as the free slots allow.

    A job whose count is unchanged keeps its nodes (nothing moves, nothing restarts). The
    others, largest first, take the better of two placements: their current replicas kept
    and the rest added (a resize in place moves nothing it need not), or a fresh best fit
    (whole free nodes first, then the fullest node that holds the remainder). The fewer
    nodes wins, the current replicas on a tie: keeping replicas whose count changes anyway
    is only worth it while it does not spread the job (on Pollux's workload 6, always
    keeping them left most replicas on more nodes than they needed, bench/scheduler.py).
    """
    free = list(slots)
    placed: dict[str, list[int]] = {}
    moving: list[JobModel] = []
    for job in jobs:
        keep = list(job.current)
        if keep and len(keep) == counts[job.name] and _fits(keep, free):
            for node in keep:
                free[node] -= 1
            placed[job.name] = keep
        else:
            moving.append(job)
    for job in sorted(moving, key=lambda j: -counts[j.name]):
        need = counts[job.name]
        nodes = _keep_then_fill(job.current[:need], need, list(free))
        if len(set(nodes)) > 1:  # one node beats any spread: its all-reduce stays local
            fresh = _best_fit(need, list(free))
            nodes = fresh if len(set(fresh)) == 1 else nodes
        for node in nodes:
            free[node] -= 1
        placed[job.name] = nodes
    return {name: tuple(sorted(nodes)) for name, nodes in placed.items()}


def _fits(nodes: Sequence[int], free: list[int]) -> bool:
    want: dict[int, int] = {}
    for node in nodes:
        want[node] = want.get(node, 0) + 1
    return all(0 <= n < len(free) and free[n] >= c for n, c in want.items())


def _keep_then_fill(current: Sequence[int], need: int, free: list[int]) -> list[int]:
    """The current replicas that still have a slot, then the rest on the nodes the job
    already uses, then on the nodes with the most free slots (``free`` is consumed)."""
    nodes: list[int] = []
    for node in current:
        if 0 <= node < len(free) and free[node] > 0:
            nodes.append(node)
            free[node] -= 1
    own = sorted(set(nodes), key=lambda n: -free[n])
    for node in own + sorted(range(len(free)), key=lambda n: (-free[n], n)):
        while len(nodes) < need and free[node] > 0:
            nodes.append(node)
            free[node] -= 1
        if len(nodes) == need:
            break
    return nodes


def _best_fit(need: int, free: list[int]) -> list[int]:
    """``need`` slots on few nodes: while no node holds the rest, the emptiest node; then
    the fullest node that holds it (``free`` is consumed)."""
    nodes: list[int] = []
    while need > 0:
        fits = [n for n in range(len(free)) if free[n] >= need]
        node = (
            min(fits, key=lambda n: (free[n], n))
            if fits
            else max(range(len(free)), key=lambda n: (free[n], -n), default=-1)
        )
        if node < 0 or free[node] <= 0:
            break
        take = min(need, free[node])
        nodes += [node] * take
        free[node] -= take
        need -= take
    return nodes

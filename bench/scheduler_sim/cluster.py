"""The cluster simulator: jobs progress by their true goodput, a policy re-decides every interval.

Time advances in scheduling intervals (60 s, as in the paper's simulator). At each
interval's start the policy sees the jobs submitted so far and not finished, and returns
the node of each replica of each job it runs, with the batch each runs at. A job whose
placement changed (a start included) loses ``restart_s`` (30 s, the paper's figure for a
checkpoint-restart) before it progresses again. During the interval a running job
progresses at its true rate::

    rate = gain(M, epoch) / T_step        steps at M0 per second
    T_step = step(placement, m) + s * (step - sync)   s accumulation micro-steps
    gain   = (var + sqr) / (var / S + sqr), S = M / M0   (grad stats from the traces)

and finishes when its progress reaches what ``max_epochs`` epochs took. At an epoch
boundary an adaptive job re-chooses its batch (its gradient statistics change by epoch).
Jobs learn their throughput model as raylight's engine does: every (nodes, replicas, m)
they run at is observed, and ``fit_perf_params`` refits on what was seen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams
from raylight.adaptive.perf_model import fit_perf_params

from .traces import Application, Arrival


@dataclass
class SimJob:
    arrival: Arrival
    app: Application
    adaptive: bool  # batch (and, with the policy, replicas) chosen by goodput
    progress: float = 0.0
    epoch: int = 0
    done_at: float | None = None
    nodes: tuple[int, ...] = ()  # node of each replica; empty: not running
    atomic: int = 0
    accum: int = 0
    restart_left: float = 0.0
    restarts: int = 0
    gpu_seconds: float = 0.0  # attained service (Tiresias' priority)
    run_seconds: float = 0.0
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    perf: PerfParams | None = None

    @property
    def name(self) -> str:
        return self.arrival.name

    @property
    def fixed_batch(self) -> bool:
        # NCF runs at its tuned batch on one GPU under every policy (as in the paper's runs).
        return not self.adaptive or self.app.name == "ncf"

    @property
    def batch(self) -> int:
        return len(self.nodes) * self.atomic * (self.accum + 1)

    @property
    def placement(self) -> tuple[int, ...]:
        """GPUs per node used (the traces' notion of a placement)."""
        counts: dict[int, int] = {}
        for n in self.nodes:
            counts[n] = counts.get(n, 0) + 1
        return tuple(sorted(counts.values()))

    def grad_params(self) -> GradParams:
        sqr, var = self.app.grad_stats(max(self.batch, self.app.init_batch_size), self.epoch)
        return GradParams(sqr, var)

    def goodput_fn(self) -> GoodputFunction | None:
        """The job's own goodput model (what it learned), None before its first step."""
        if self.perf is None:
            return None
        return GoodputFunction(self.perf, self.grad_params(), self.app.init_batch_size)

    @property
    def max_profiled_replicas(self) -> int:
        return max((k[1] for k in self.profile), default=0)

    def observe(self) -> None:
        """Record the layout now running (one observation per new layout) and refit."""
        key = (len(self.placement), len(self.nodes), self.atomic)
        if key in self.profile:
            return
        self.profile[key] = self.app.step_time(self.placement, self.atomic)
        n, r, m = (np.array([k[i] for k in self.profile]) for i in range(3))
        step = np.array([v[0] for v in self.profile.values()])
        sync = np.array([v[1] for v in self.profile.values()])
        self.perf = fit_perf_params(n, r, m, step - sync, step, start=self.perf)

    def choose_batch(self) -> None:
        """(atomic, accum) for the current replicas: the tuned batch for a fixed-batch job,
        else the goodput model's best."""
        k, app = len(self.nodes), self.app
        good = self.goodput_fn()
        if k == 0:
            self.atomic = self.accum = 0
            return
        if self.fixed_batch or good is None:
            target = self.arrival.batch_size if self.fixed_batch else app.init_batch_size
            target = max(target, app.init_batch_size)
            local = math.ceil(target / k)
            self.accum = max(math.ceil(local / app.max_local_bsz) - 1, 0)
            self.atomic = max(math.ceil(local / (self.accum + 1)), app.min_local_bsz)
            return
        _, atomic, accum = good.optimize(
            len(self.placement), k, max_batch_size=app.max_batch_size,
            atomic_bsz_range=(app.min_local_bsz, app.max_local_bsz), accumulation=True,
        )
        self.atomic, self.accum = int(atomic), int(accum)

    def advance(self, now: float, seconds: float) -> None:
        """Run ``seconds`` of simulated time from ``now``."""
        if not self.nodes or self.done_at is not None:
            return
        k = len(self.nodes)
        delay = min(self.restart_left, seconds)
        self.restart_left -= delay
        self.gpu_seconds += delay * k
        t, left = now + delay, seconds - delay
        while left > 1e-9 and self.done_at is None:
            step, sync = self.app.step_time(self.placement, self.atomic)
            scale = self.batch / self.app.init_batch_size
            sqr, var = self.app.grad_stats(self.batch, self.epoch)
            gain = (var + sqr) / (var / scale + sqr) if var / scale + sqr > 0 else 1.0
            rate = gain / (step + self.accum * (step - sync))
            target = self.app.progress_at(self.epoch + 1)
            need = (target - self.progress) / rate
            if need > left:
                self.progress += rate * left
                t, used = t + left, left
            else:
                self.progress, self.epoch = target, self.epoch + 1
                t, used = t + need, need
                if self.epoch >= self.app.max_epochs:
                    self.done_at = t
                elif self.adaptive:
                    self.choose_batch()
                    self.observe()
            left -= used
            self.gpu_seconds += used * k
            self.run_seconds += used


# A policy: (now, active jobs in arrival order, GPUs per node) -> node of each replica per
# job (a job left out does not run). It may set a job's batch; the simulator sets the rest.
Policy = Callable[[float, list[SimJob], list[int]], dict[str, tuple[int, ...]]]
# Cloud mode: (now, active jobs, GPUs per node slot now) -> GPUs per node slot this interval.
Scale = Callable[[float, list[SimJob], list[int]], list[int]]


@dataclass
class Outcome:
    jcts: dict[str, float]
    completion: dict[str, float]
    intervals: int
    max_gpus_used: int
    restarts: int
    gpu_utilisation: float  # busy GPU-seconds / (GPUs x makespan)
    decision_s: list[float]
    wall_s: float
    node_seconds: float = 0.0  # nodes on x time (every node, all the time, on a fixed cluster)

    @property
    def avg_jct(self) -> float:
        return float(np.mean(list(self.jcts.values())))

    @property
    def p99_jct(self) -> float:
        return float(np.percentile(list(self.jcts.values()), 99))

    @property
    def makespan(self) -> float:
        return max(self.completion.values())


def simulate(
    arrivals: list[Arrival],
    apps: dict[str, Application],
    policy: Policy,
    *,
    adaptive: bool,
    nodes: int = 16,
    gpus_per_node: int = 4,
    interval_s: float = 60.0,
    restart_s: float = 30.0,
    max_hours: float = 200.0,
    scale: Scale | None = None,
) -> Outcome:
    """Run ``arrivals`` to the end under ``policy``; every job must finish within ``max_hours``.
    ``scale`` (cloud mode, cloud.py): at each interval's start, the GPUs of each of the
    ``nodes`` node slots for this interval (0: the node is not there)."""
    start = time.perf_counter()
    jobs = [SimJob(a, apps[a.application], adaptive) for a in arrivals]
    slots = [gpus_per_node] * nodes
    now, intervals, max_used, busy, node_seconds = 0.0, 0, 0, 0.0, 0.0
    decision: list[float] = []
    while any(j.done_at is None for j in jobs):
        if now > max_hours * 3600:
            raise RuntimeError(f"jobs still running after {max_hours} simulated hours")
        active = [j for j in jobs if j.arrival.time <= now and j.done_at is None]
        if scale is not None:
            slots = scale(now, active, list(slots))
        node_seconds += sum(1 for s in slots if s > 0) * interval_s
        if active:
            t0 = time.perf_counter()
            placed = policy(now, active, list(slots))
            decision.append(time.perf_counter() - t0)
            used: dict[int, int] = {}
            for job in active:
                new = tuple(sorted(placed.get(job.name, ())))
                for n in new:
                    used[n] = used.get(n, 0) + 1
                if new != job.nodes:
                    job.nodes = new
                    job.restart_left = restart_s if new else 0.0
                    job.restarts += bool(new)
                    job.choose_batch()
                    if new and job.adaptive:
                        job.observe()
                        job.choose_batch()
            assert all(0 <= n < nodes and c <= slots[n] for n, c in used.items()), used
            max_used = max(max_used, sum(used.values()))
            busy += sum(used.values()) * interval_s
        for job in active:
            job.advance(now, interval_s)
        now += interval_s
        intervals += 1
    completion = {j.name: float(j.done_at) for j in jobs if j.done_at is not None}
    makespan = max(completion.values())
    return Outcome(
        jcts={j.name: completion[j.name] - j.arrival.time for j in jobs},
        completion=completion,
        intervals=intervals,
        max_gpus_used=max_used,
        restarts=sum(max(j.restarts - 1, 0) for j in jobs),
        gpu_utilisation=busy / (nodes * gpus_per_node * makespan),
        decision_s=decision,
        wall_s=time.perf_counter() - start,
        node_seconds=node_seconds,
    )


def no_contention_s(arrival: Arrival, app: Application) -> float:
    """A lower bound on a fixed-batch job's time at its tuned size, alone on the cluster
    (packed on the fewest nodes, no restart), for the tests' JCT check."""
    job = SimJob(arrival, app, adaptive=False)
    per_node, k = 4, arrival.num_replicas
    job.nodes = tuple(i // per_node for i in range(k))
    job.choose_batch()
    t = 0.0
    while job.done_at is None:
        job.advance(t, 3600.0)
        t += 3600.0
    return float(job.done_at)

"""Fake jobs that follow the scheduler as raylight runs do, with no Ray (a test helper).

Each job reports every ``report_s`` (its adaptive decision) the nodes its workers run on;
it follows its answer's worker count as ``scaling.py``'s ``_follow_share`` does: at most
every ``resize_interval_s``, growing only into what is free on the cluster now (Ray places
workers where resources are free), and a resize takes ``resize_s`` (decision to first step
at the new size), during which its reports still show its old nodes (the keepalive repeats
the last report). ``simulate`` steps them on a shared fake clock and records what happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raylight.scheduler.state import SchedulerState


@dataclass
class FakeJob:
    job_id: str
    model: dict[str, Any]
    arrive_s: float = 0.0
    min_workers: int = 1
    max_workers: int = 4
    weight: float = 1.0
    resize_s: float = 20.0
    resize_interval_s: float = 5.0
    nodes: list[str] = field(default_factory=list)  # where its workers run now
    resizing: tuple[float, int] | None = None  # (done at, to) while a resize is in flight
    last_resize: float = -1e9
    told: int = 0
    jitter: float = 0.0  # each report's fitted throughput model is off by +-jitter, alternately
    phase: int = 0
    reports: int = 0
    resizes: list[tuple[float, int, int]] = field(default_factory=list)  # (at, from, to)

    def report(self) -> dict[str, Any]:
        """Its model as refitted at this decision (its sync cost off by +-jitter), and its nodes."""
        self.reports += 1
        sign = 1 if (self.reports + self.phase) % 2 else -1
        perf = list(self.model["perf"])
        perf[2] *= 1 + sign * self.jitter  # the sync cost across replicas, refitted
        perf[4] *= 1 + sign * self.jitter
        return {**self.model, "perf": perf, "nodes": list(self.nodes)}

    def fields(self) -> dict[str, Any]:
        return {"min_workers": self.min_workers, "max_workers": self.max_workers, "weight": self.weight}


@dataclass
class Record:
    answers: list[tuple[float, str, int, dict[str, int]]]  # (t, job, told, others' held)
    resizes: dict[str, list[tuple[float, int, int]]]
    held: list[dict[str, int]]  # each step's running workers per job


def simulate(state: SchedulerState, clock: Any, jobs: list[FakeJob], slots: dict[str, int], *, until_s: float, report_s: float = 2.0) -> Record:
    answers: list[tuple[float, str, int, dict[str, int]]] = []
    held: list[dict[str, int]] = []
    registered: set[str] = set()
    t = 0.0
    while t <= until_s:
        clock.now = t
        for job in jobs:
            if job.resizing is not None and t >= job.resizing[0]:
                job.resizes.append((job.resizing[0], len(job.nodes), job.resizing[1]))
                job.nodes = _place(job.resizing[1], job, jobs, slots)
                job.resizing, job.last_resize = None, t
        for job in jobs:
            if t < job.arrive_s:
                continue
            if job.job_id not in registered:
                answer = state.register(job.job_id, **job.fields())
                registered.add(job.job_id)
            else:
                answer = state.report(job.job_id, job.report(), **job.fields())
            others = {j.job_id: len(j.nodes) for j in jobs if j is not job}
            answers.append((t, job.job_id, int(answer["workers"]), others))
            job.told = int(answer["workers"])
            _follow(job, jobs, slots, t)
        held.append({j.job_id: len(j.nodes) for j in jobs})
        t = round(t + report_s, 6)
    return Record(answers, {j.job_id: j.resizes for j in jobs}, held)


def _free(job: FakeJob, jobs: list[FakeJob], slots: dict[str, int]) -> int:
    return sum(slots.values()) - sum(max(len(j.nodes), j.resizing[1] if j.resizing else 0) for j in jobs if j is not job)


def _follow(job: FakeJob, jobs: list[FakeJob], slots: dict[str, int], t: float) -> None:
    if job.resizing is not None or job.told <= 0 or t - job.last_resize < job.resize_interval_s:
        return
    want = job.told if job.told <= len(job.nodes) else min(job.told, _free(job, jobs, slots))
    want = max(job.min_workers, min(job.max_workers, want))
    if want != len(job.nodes) and want <= _free(job, jobs, slots):
        job.resizing = (t + (job.resize_s if job.nodes else 1.0), want)


def _place(count: int, job: FakeJob, jobs: list[FakeJob], slots: dict[str, int]) -> list[str]:
    """``count`` workers on the nodes with free slots (its own first), as Ray would."""
    used = {n: 0 for n in slots}
    for other in jobs:
        if other is not job:
            for n in other.nodes:
                used[n] += 1
    nodes = [n for n in job.nodes if used[n] < slots[n]][:count]
    for n in nodes:
        used[n] += 1
    for n in sorted(slots):
        while len(nodes) < count and used[n] < slots[n]:
            nodes.append(n)
            used[n] += 1
    return nodes

"""The policies compared: raylight's SharingPolicy and three fixed-size baselines.

- ``sharing``: raylight.adaptive.sharing.SharingPolicy (replicas, nodes and batch by
  goodput, p = -1). Each job brings the goodput model it learned from the layouts it ran
  (a job that has not run yet is a 1-GPU job), and may grow to twice the replicas it has
  run at (the exploration bound the AdaptDL agent uses: a model is not trusted far past
  what it has seen). NCF jobs stay at their tuned 1 GPU and batch, as in the paper.
- ``fifo``: each job at its tuned GPU count and batch (the workload's columns), strictly
  in arrival order, never preempted; the head waits until its GPUs are free.
- ``fair``: each job at its tuned batch; the GPUs are divided max-min fairly (equal shares,
  capped at a job's tuned count, the rest shared out again), re-divided every interval.
- ``tiresias``: raylight's re-implementation of Tiresias' discretised 2D-LAS (Gu et al.,
  NSDI'19): jobs at their tuned sizes, in priority queues by attained GPU-time (thresholds
  in GPU-seconds; the artifact's setting, one threshold of 16 GPU-hours), FIFO within a
  queue, preemptive, a lower-priority job started where a higher one does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from raylight.adaptive.sharing import JobModel, SharingPolicy

from .cluster import Policy, SimJob


def pack(
    want: dict[str, int], jobs: Sequence[SimJob], slots: list[int]
) -> dict[str, tuple[int, ...]]:
    """Nodes for ``want[name]`` replicas each: a job whose count is unchanged keeps its
    nodes; the others, largest first, go to the nodes with the most free GPUs."""
    free = list(slots)
    out: dict[str, tuple[int, ...]] = {}
    for job in jobs:
        if job.name in want and len(job.nodes) == want[job.name] and want[job.name] > 0:
            out[job.name] = job.nodes
            for n in job.nodes:
                free[n] -= 1
    for job in sorted(jobs, key=lambda j: -want.get(j.name, 0)):
        need = want.get(job.name, 0)
        if job.name in out or need <= 0:
            continue
        nodes: list[int] = []
        while need > 0:
            n = max(range(len(free)), key=lambda i: (free[i], -i))
            if free[n] <= 0:
                break
            take = min(need, free[n])
            nodes += [n] * take
            free[n] -= take
            need -= take
        assert need == 0, f"{job.name}: {want[job.name]} replicas do not fit"
        out[job.name] = tuple(nodes)
    return out


def fifo() -> Policy:
    def decide(now: float, jobs: list[SimJob], slots: list[int]) -> dict[str, tuple[int, ...]]:
        free = sum(slots) - sum(len(j.nodes) for j in jobs)
        want = {j.name: len(j.nodes) for j in jobs if j.nodes}
        for job in jobs:  # arrival order; the first that does not fit blocks the rest
            if job.nodes:
                continue
            if job.arrival.num_replicas > free:
                break
            want[job.name] = job.arrival.num_replicas
            free -= job.arrival.num_replicas
        return pack(want, jobs, slots)

    return decide


def fair() -> Policy:
    def decide(now: float, jobs: list[SimJob], slots: list[int]) -> dict[str, tuple[int, ...]]:
        total = sum(slots)
        want = {j.name: 0 for j in jobs}
        open_ = list(jobs)
        left = total
        while open_ and left > 0:
            share = max(left // len(open_), 1)
            for job in list(open_):
                if left <= 0:
                    break
                add = min(share, job.arrival.num_replicas - want[job.name], left)
                want[job.name] += add
                left -= add
                if want[job.name] >= job.arrival.num_replicas:
                    open_.remove(job)
        return pack(want, jobs, slots)

    return decide


def tiresias(thresholds_gpu_s: Sequence[float] = (16 * 3600.0,)) -> Policy:
    entered: dict[str, tuple[int, float]] = {}  # job -> (queue, when it entered it)

    def queue(job: SimJob) -> int:
        return sum(job.gpu_seconds >= t for t in thresholds_gpu_s)

    def decide(now: float, jobs: list[SimJob], slots: list[int]) -> dict[str, tuple[int, ...]]:
        for job in jobs:
            q = queue(job)
            if entered.get(job.name, (None,))[0] != q:
                entered[job.name] = (q, now if job.name in entered else job.arrival.time)
        order = sorted(jobs, key=lambda j: (entered[j.name], j.arrival.time))
        free = sum(slots)
        want: dict[str, int] = {}
        for job in order:
            if job.arrival.num_replicas <= free:
                want[job.name] = job.arrival.num_replicas
                free -= job.arrival.num_replicas
        return pack(want, jobs, slots)

    return decide


def sharing(
    *,
    p: float = -1.0,
    horizon_s: float = 60.0,
    restart_s: float = 30.0,
    order: str = "arrival",
    baseline: str = "min",
) -> tuple[Policy, SharingPolicy]:
    """The SharingPolicy as a simulator policy; ``order`` is the admission order when the
    jobs outnumber the GPUs: ``arrival`` (first come first served) or ``service`` (least
    attained GPU-time first, as Pollux sorts its jobs)."""
    policy = SharingPolicy(p=p, horizon_s=horizon_s, baseline=baseline)

    def decide(now: float, jobs: list[SimJob], slots: list[int]) -> dict[str, tuple[int, ...]]:
        alloc = policy.allocate([job_model(j, restart_s) for j in ranked(jobs, order)], slots)
        return {name: a.nodes for name, a in alloc.jobs.items() if a.nodes}

    return decide, policy


def ranked(jobs: list[SimJob], order: str) -> list[SimJob]:
    """The admission order: ``arrival``, or ``service`` (least attained GPU-time first)."""
    return jobs if order == "arrival" else sorted(jobs, key=lambda j: (j.gpu_seconds, j.arrival.time))


def job_model(job: SimJob, restart_s: float) -> JobModel:
    """What a simulated job tells the SharingPolicy (see ``sharing``)."""
    app = job.app
    good = None if job.app.name == "ncf" else job.goodput_fn()
    if good is None:
        return JobModel(job.name, None, min_replicas=1, current=job.nodes, resize_cost_s=restart_s)
    cap = min(max(2 * job.max_profiled_replicas, 1), 64, app.max_batch_size // app.min_local_bsz)
    return JobModel(
        job.name, good, min_replicas=1, max_replicas=cap, max_batch_size=app.max_batch_size,
        atomic_bsz_range=(app.min_local_bsz, app.max_local_bsz), accumulation=True,
        current=job.nodes, resize_cost_s=restart_s,
    )

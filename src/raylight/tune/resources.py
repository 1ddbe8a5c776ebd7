"""What a trial asks of the cluster, and how many trials fit at once. Pure arithmetic
(``plan_concurrency``) beside the two calls that read the cluster.

A trial is a placement group: a head bundle for the trial's driver (the Tune trainable,
which runs raylight's controller; it needs no CPU, so it never competes with the
workers) and one bundle per worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raylight.base.exceptions import InsufficientResourcesError
from raylight.config.schema import WORKER_CPUS, default_worker_resources


def trial_bundles(
    *,
    num_workers: int,
    use_gpu: bool = False,
    cpus_per_worker: float = WORKER_CPUS,
    resources_per_worker: dict[str, float] | None = None,
    head_cpus: float = 0.0,
) -> list[dict[str, float]]:
    """The bundles of one trial: ``[head, worker, worker, ...]``."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    worker = default_worker_resources({"CPU": cpus_per_worker, **(resources_per_worker or {})}, use_gpu=use_gpu)
    if worker.get("CPU", 0) <= 0 and worker.get("GPU", 0) <= 0:
        raise ValueError(f"a worker needs some CPU or GPU, got {worker}")
    head = {"CPU": float(head_cpus)} if head_cpus > 0 else {}
    return [head, *([{k: v for k, v in worker.items() if v > 0}] * num_workers)]


def total(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


@dataclass(frozen=True)
class ConcurrencyPlan:
    """How many trials run at once, and why."""

    max_concurrent: int
    reason: str


def plan_concurrency(
    *,
    per_trial: dict[str, float],
    cluster: dict[str, float],
    nodes: list[dict[str, float]],
    num_trials: int,
    requested: int | str,
    reserve: dict[str, float] | None = None,
    setting: str = "the trial's resources",
) -> ConcurrencyPlan:
    """Trials to run at once. ``requested`` is an int or ``"auto"``: as many as the
    cluster's resources, less ``reserve`` (what must stay free for other work, e.g. Ray
    Data), hold side by side. Raises InsufficientResourcesError when one trial can
    never be placed (Ray Tune would wait for it forever), naming ``setting``."""
    short = {k: v for k, v in per_trial.items() if v > cluster.get(k, 0.0)}
    if short:
        have = {k: cluster.get(k, 0.0) for k in short}
        raise InsufficientResourcesError(
            f"one trial needs {_fmt(per_trial)} but the cluster has {_fmt(have)} in all, so "
            f"no trial could ever start; lower {setting} or use a larger cluster"
        )
    if not nodes:
        raise InsufficientResourcesError("the cluster has no live nodes")
    if requested != "auto":
        n = int(requested)
        return ConcurrencyPlan(max(1, min(n, num_trials)), f"max_concurrent_trials={n}")
    reserve = reserve or {}
    fits = math.inf
    for k, v in per_trial.items():
        if v > 0:
            fits = min(fits, (cluster.get(k, 0.0) - reserve.get(k, 0.0)) // v)
    n = int(max(1, min(fits, num_trials)))
    why = f"auto: the cluster's {_fmt({k: cluster.get(k, 0.0) for k in per_trial})}"
    if reserve:
        why += f" less {_fmt(reserve)} kept free"
    why += f" hold {int(max(fits, 1)) if fits != math.inf else num_trials} trial(s) of {_fmt(per_trial)}"
    return ConcurrencyPlan(n, why + f"; {num_trials} trial(s) in all")


def check_bundles_fit(bundles: list[dict[str, float]], nodes: list[dict[str, float]], setting: str) -> None:
    """Each bundle must fit on some node, or the trial can never be placed."""
    for b in bundles:
        if b and not any(all(node.get(k, 0.0) >= v for k, v in b.items()) for node in nodes):
            raise InsufficientResourcesError(
                f"no node of the cluster can hold one bundle {_fmt(b)} of a trial; lower {setting}"
            )


def cluster_view() -> tuple[dict[str, float], list[dict[str, float]]]:
    """Total resources and each live node's resources, from the connected Ray."""
    import ray

    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    return total(nodes), nodes


def get_tune_resources(
    num_workers: int = 1,
    *,
    use_gpu: bool = False,
    cpus_per_worker: float = WORKER_CPUS,
    resources_per_worker: dict[str, float] | None = None,
    head_cpus: float = 0.0,
) -> Any:
    """A ``PlacementGroupFactory`` for a trial that runs ``num_workers`` raylight
    workers: an empty head bundle for the trial driver (or ``head_cpus``) and one bundle
    per worker. raylight's worker group places its workers in those bundles."""
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory(
        trial_bundles(
            num_workers=num_workers,
            use_gpu=use_gpu,
            cpus_per_worker=cpus_per_worker,
            resources_per_worker=resources_per_worker,
            head_cpus=head_cpus,
        )
    )

"""Placement: where a group's worker processes go.

Placement groups (reserved, checked for feasibility first, removed), the bundles of an
outer group (a Ray Tune trial's), ranks by node, the nodes Ray is draining, the driver's
own node, autoscaler requests, and the actor options that put a worker process in a
bundle or pin it to a node. Functions of plain arguments: the worker group
(``ray_group.py``) holds the state.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from raylight.base.clock import monotonic
from raylight.base.exceptions import InsufficientResourcesError
from raylight.config import FailureConfig, ScalingConfig
from raylight.worker.session import RankInfo
from raylight.worker_group.ray_client import client_driver
from raylight.worker_group.worker import RaylightWorker

RemoteWorker = ray.remote(RaylightWorker)

# An elastic start waits this long for a size above its minimum before trying fewer: a
# healthy cluster places a group in milliseconds; free resources read a moment earlier
# can already be taken.
ELASTIC_PLACEMENT_WAIT_S = 2.0


# How often the group asks Ray which nodes are being drained (a GCS call, answered in
# about a millisecond): a drain's deadline can be a few seconds, so it is seen within a
# quarter of one. The call's own timeout (a Ray Client driver's task) is longer.
DRAIN_CHECK_S = 0.25
DRAIN_CHECK_TIMEOUT_S = 1.0


def on_cluster(fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """``fn(*args)`` here or, on a Ray Client driver, in a zero-CPU task on the cluster,
    waited for at most ``timeout_s`` (``GetTimeoutError`` after)."""
    if not client_driver():
        return fn(*args)
    return ray.get(_as_task(fn).remote(*args), timeout=timeout_s)


@functools.cache
def _as_task(fn: Callable[..., Any]) -> Any:
    """``fn`` as a zero-CPU remote function, made once per process (as Ray Data's
    ``cached_remote_fn``): the drain check calls it every second."""
    return ray.remote(num_cpus=0)(fn)


def _draining() -> dict[Any, int]:
    from ray._private.state import state

    return dict(state.get_draining_nodes())


def draining_nodes() -> dict[str, float | None]:
    """Nodes Ray is draining (``ray drain-node``, the autoscaler, a cloud's preemption
    through KubeRay): node id -> the wall-clock deadline (None: none given). Empty where
    Ray cannot say."""
    try:
        found = on_cluster(_draining, timeout_s=DRAIN_CHECK_TIMEOUT_S)
    except Exception:  # Ray's private API moved, or the cluster did not answer: no notices now
        return {}
    return {str(node): (ms / 1000.0 if ms else None) for node, ms in found.items()}


def _request_resources(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


# A placement group asked for while the resources of one just removed are still being
# freed waits for Ray's retry of pending groups (0.3-0.9 s here); one asked for once they
# are free is placed in milliseconds. So a new group first waits, at most this long, for
# what this process removed lately to show up as available.
REMOVAL_WAIT_S = 1.0
_removed_at = [-1e9]


def remove_group(pg: PlacementGroup) -> None:
    remove_placement_group(pg)
    _removed_at[0] = monotonic()


def _await_removals(need: dict[str, float]) -> None:
    deadline = _removed_at[0] + REMOVAL_WAIT_S
    while monotonic() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0.0) >= v for k, v in need.items()):
            return
        time.sleep(0.01)


def fmt_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items()))


def _node_capacities() -> list[dict[str, float]]:
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def check_feasible(
    num_workers: int, per_worker: dict[str, float], placement: str, nodes: list[dict[str, float]]
) -> str | None:
    """Why ``num_workers`` bundles of ``per_worker`` can never fit on ``nodes``, or None."""
    total: dict[str, float] = defaultdict(float)
    for node in nodes:
        for key, amount in node.items():
            total[key] += amount
    need = {k: v * num_workers for k, v in per_worker.items()}
    short = {k: v for k, v in need.items() if total.get(k, 0.0) < v}
    if short:
        have = {k: total.get(k, 0.0) for k in short}
        return f"{num_workers} workers x {{{fmt_resources(per_worker)}}} need {{{fmt_resources(need)}}}; the cluster has {{{fmt_resources(have)}}} in all"
    if not any(all(node.get(k, 0.0) >= v for k, v in per_worker.items()) for node in nodes):
        return f"no node can hold one worker's {{{fmt_resources(per_worker)}}}"
    if placement == "STRICT_PACK" and not any(
        all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes
    ):
        return f"STRICT_PACK needs {{{fmt_resources(need)}}} on one node; no node has that much"
    if placement == "STRICT_SPREAD" and len(nodes) < num_workers:
        return f"STRICT_SPREAD needs {num_workers} nodes; the cluster has {len(nodes)}"
    return None


def embedded_shortfall(reason: str) -> InsufficientResourcesError:
    return InsufficientResourcesError(
        f"cannot place the workers: {reason}. The embedded local Ray has no autoscaler; "
        "lower num_workers or resources_per_worker, or connect to a larger cluster with "
        "address=."
    )


def check_embedded(num_workers: int, per_worker: dict[str, float], placement: str, capacity: dict[str, float]) -> None:
    """Before starting the embedded local Ray: fail at once when ``capacity`` (what it
    would have, ``runtime.local_capacity``) can never place the workers. Resources whose
    amount is not known without starting Ray (memory; GPUs where a driver exists) are
    left to Ray."""
    known = {k: v for k, v in per_worker.items() if k in capacity or k not in _RAY_SIZED}
    reason = check_feasible(num_workers, known, placement, [capacity])
    if reason:
        raise embedded_shortfall(reason)


_RAY_SIZED = {"memory", "object_store_memory", "GPU"}  # sized by Ray when it starts


def worker_bundles(bundles: list[dict[str, float]], per_worker: dict[str, float], max_workers: int) -> list[int]:
    """Indices of the bundles of an existing placement group that hold workers: those
    big enough for one worker, the last ``max_workers`` of them (a trial's head bundle,
    where its driver runs, comes first, as in Ray Tune's layout)."""
    fits = [i for i, b in enumerate(bundles) if all(b.get(k, 0.0) >= v for k, v in per_worker.items())]
    return fits[-max_workers:] if max_workers > 0 else []


def assign_ranks(bundle_nodes: list[str]) -> list[RankInfo]:
    """Ranks for bundles placed on ``bundle_nodes``: contiguous per node, nodes in the
    order they first appear. Returns one RankInfo per bundle, in bundle order."""
    order: list[str] = []
    for node in bundle_nodes:
        if node not in order:
            order.append(node)
    per_node = {node: [i for i, n in enumerate(bundle_nodes) if n == node] for node in order}
    infos: dict[int, RankInfo] = {}
    rank = 0
    for node_rank, node in enumerate(order):
        bundles = per_node[node]
        for local_rank, bundle in enumerate(bundles):
            infos[bundle] = RankInfo(rank, local_rank, len(bundle_nodes), len(bundles), node_rank)
            rank += 1
    return [infos[i] for i in range(len(bundle_nodes))]


def reserve_group(
    num_workers: int,
    scaling: ScalingConfig,
    failure: FailureConfig,
    *,
    embedded: bool,
    wait_s: float | None = None,
    fail_fast: bool = True,
) -> PlacementGroup | None:
    """A placement group for ``num_workers`` workers, placed within ``wait_s``
    (None: FailureConfig.placement_timeout_s, then InsufficientResourcesError);
    None where ``wait_s`` was given and it was not placed, or could never be."""
    per_worker = scaling.worker_resources()
    placement = scaling.placement
    reason = check_feasible(num_workers, per_worker, placement, _node_capacities())
    if reason and embedded and fail_fast:
        raise embedded_shortfall(reason)
    if reason and embedded:  # never here: let the caller try fewer
        return None
    _await_removals({k: v * num_workers for k, v in per_worker.items()})
    pg = placement_group([dict(per_worker)] * num_workers, strategy=placement)
    timeout = failure.placement_timeout_s
    ready, _ = ray.wait([pg.ready()], timeout=timeout if wait_s is None else wait_s)
    if ready:
        return pg
    remove_placement_group(pg)
    if wait_s is not None:
        return None
    available = {k: v for k, v in ray.available_resources().items() if k in per_worker}
    why = f" ({reason})" if reason else ""
    raise InsufficientResourcesError(
        f"the cluster did not place {num_workers} workers x {{{fmt_resources(per_worker)}}} "
        f"within FailureConfig.placement_timeout_s={timeout:g}s{why}; available now: "
        f"{{{fmt_resources(available)}}}. Lower num_workers or resources_per_worker, free "
        "resources, or raise placement_timeout_s for an autoscaling cluster."
    )


def slot_nodes(slots: list[tuple[PlacementGroup, int]]) -> list[str | None]:
    """Each slot's node where it is this driver's node (pooled workers live only
    there), else None (a worker inside the bundle, killed when its run ends)."""
    home = driver_node()
    tables: dict[int, dict[int, str]] = {}
    nodes: list[str | None] = []
    for pg, bundle in slots:
        if id(pg) not in tables:
            tables[id(pg)] = placement_group_table(pg).get("bundles_to_node_id", {})
        node = tables[id(pg)].get(bundle)
        nodes.append(node if node is not None and node == home else None)
    return nodes


def bundle_worker(slot: tuple[PlacementGroup, int], scaling: ScalingConfig, runtime_env: dict[str, Any] | None, *args: Any) -> Any:
    """A new worker process inside placement-group bundle ``slot``, holding one worker's
    resources there."""
    pg, bundle = slot
    per_worker = scaling.worker_resources()
    custom = {k: v for k, v in per_worker.items() if k not in ("CPU", "GPU")}
    return RemoteWorker.options(
        max_restarts=0,
        runtime_env=runtime_env,
        num_cpus=per_worker.get("CPU", 0),
        num_gpus=per_worker.get("GPU", 0),
        resources=custom or None,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle),
    ).remote(*args)


def pinned_worker(node_id: str, runtime_env: dict[str, Any] | None, *args: Any) -> Any:
    """A new worker process on ``node_id`` that holds no Ray resources: a pooled worker,
    which outlives its run's placement group (whose bundle holds its reservation while it
    trains)."""
    return RemoteWorker.options(
        max_restarts=0,
        runtime_env=runtime_env,
        num_cpus=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(*args)


def driver_node() -> str | None:
    """The node this driver runs on; None where Ray cannot say (a Ray Client driver).
    Only its workers are pooled: an idle worker elsewhere would keep an autoscaled node
    (and its bill) alive, and one in the bundle dies with its node as Ray expects."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return None

"""RayWorkerGroup: workers as Ray actors in one placement group.

Start-up: reserve a placement group (fail fast when the cluster can never fit it,
else wait at most ``placement_timeout_s``), give ranks by node, create one actor per
bundle, open the rendezvous store on rank 0's node, start the loops. Polling: one
``poll`` call per worker, bounded by ``health_check_timeout_s``; dead actors and
workers without progress for ``hang_timeout_s`` become failures. Shutdown kills every
actor and removes the placement group.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylight.config import FailureConfig, ScalingConfig
from raylight.exceptions import InsufficientResourcesError, WorkerStartError
from raylight.strategies import build_strategy
from raylight.worker_group.protocol import GroupPoll, WorkerFailure, WorkerPoll
from raylight.worker_group.worker import RankInfo, RaylightWorker, StartSpec

log = logging.getLogger("raylight")

_RemoteWorker = ray.remote(RaylightWorker)


def _fmt(resources: dict[str, float]) -> str:
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
        return f"{num_workers} workers x {{{_fmt(per_worker)}}} need {{{_fmt(need)}}}; the cluster has {{{_fmt(have)}}} in all"
    if not any(all(node.get(k, 0.0) >= v for k, v in per_worker.items()) for node in nodes):
        return f"no node can hold one worker's {{{_fmt(per_worker)}}}"
    if placement == "STRICT_PACK" and not any(
        all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes
    ):
        return f"STRICT_PACK needs {{{_fmt(need)}}} on one node; no node has that much"
    if placement == "STRICT_SPREAD" and len(nodes) < num_workers:
        return f"STRICT_SPREAD needs {num_workers} nodes; the cluster has {len(nodes)}"
    return None


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


class RayWorkerGroup:
    """Implements the ``WorkerGroup`` protocol on Ray actors."""

    def __init__(
        self,
        train_loop: Any,
        loop_config: dict[str, Any] | None,
        *,
        scaling: ScalingConfig,
        failure: FailureConfig,
        run_name: str,
        embedded: bool,
    ) -> None:
        self._fn = train_loop
        self._loop_config = loop_config
        self._scaling = scaling
        self._failure = failure
        self._run_name = run_name
        self._embedded = embedded
        self._pg: PlacementGroup | None = None
        self._workers: list[Any] = []  # actor handles, index = rank
        self._nodes: list[dict[str, Any]] = []

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    # -- start --------------------------------------------------------------------
    def start(self, *, num_workers: int, checkpoint: Any = None) -> None:
        try:
            self._start(num_workers, checkpoint)
        except BaseException:
            self.shutdown()
            raise

    def _reserve(self, num_workers: int) -> PlacementGroup:
        per_worker = self._scaling.worker_resources()
        placement = self._scaling.placement
        reason = check_feasible(num_workers, per_worker, placement, _node_capacities())
        if reason and self._embedded:
            raise InsufficientResourcesError(
                f"cannot place the workers: {reason}. This embedded local Ray has no "
                "autoscaler; lower num_workers or resources_per_worker, or connect to a "
                "larger cluster with address=."
            )
        pg = placement_group([dict(per_worker)] * num_workers, strategy=placement)
        timeout = self._failure.placement_timeout_s
        ready, _ = ray.wait([pg.ready()], timeout=timeout)
        if not ready:
            remove_placement_group(pg)
            available = {k: v for k, v in ray.available_resources().items() if k in per_worker}
            why = f" ({reason})" if reason else ""
            raise InsufficientResourcesError(
                f"the cluster did not place {num_workers} workers x {{{_fmt(per_worker)}}} "
                f"within FailureConfig.placement_timeout_s={timeout:g}s{why}; available now: "
                f"{{{_fmt(available)}}}. Lower num_workers or resources_per_worker, free "
                "resources, or raise placement_timeout_s for an autoscaling cluster."
            )
        return pg

    def _start(self, num_workers: int, checkpoint: Any) -> None:
        if num_workers < 1:
            raise ValueError(f"a worker group needs at least 1 worker, got {num_workers}")
        per_worker = self._scaling.worker_resources()
        self._pg = pg = self._reserve(num_workers)
        bundle_nodes = placement_group_table(pg)["bundles_to_node_id"]
        ranks = assign_ranks([bundle_nodes[i] for i in range(num_workers)])
        custom = {k: v for k, v in per_worker.items() if k not in ("CPU", "GPU")}
        actors: list[Any] = [None] * num_workers
        for bundle, info in enumerate(ranks):
            actors[info.rank] = _RemoteWorker.options(
                num_cpus=per_worker.get("CPU", 0),
                num_gpus=per_worker.get("GPU", 0),
                resources=custom or None,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                ),
            ).remote(info, self._run_name)
        self._workers = actors
        timeout = self._failure.worker_start_timeout_s
        self._nodes = self._get([w.node_info.remote() for w in actors], timeout, "start")

        ips = {n["ip"] for n in self._nodes}
        loopback = len(ips) == 1
        master = "127.0.0.1" if loopback else self._nodes[0]["ip"]
        port = self._get([actors[0].open_store.remote(master, num_workers, timeout)], timeout, "open the rendezvous store")[0]

        visible = self._cuda_visible_devices(ranks)
        backend = build_strategy(self._scaling.strategy).backend(self._scaling.use_gpu)
        ckpt_ref = ray.put(checkpoint.to_bytes()) if checkpoint is not None else None
        starts = []
        for rank, actor in enumerate(actors):
            spec = StartSpec(
                master_addr=master,
                master_port=port,
                backend=backend,
                threads=self._scaling.worker_threads(),
                use_gpu=self._scaling.use_gpu,
                collective_timeout_s=self._failure.collective_timeout_s,
                cuda_visible_devices=visible[rank],
                loopback=loopback,
                checkpoint_path=checkpoint.path if checkpoint is not None else None,
                checkpoint_meta=checkpoint.metadata if checkpoint is not None else None,
            )
            starts.append(actor.start.remote(self._fn, self._loop_config, spec, ckpt_ref))
        self._get(starts, timeout, "start the training loop")

    def _cuda_visible_devices(self, ranks: list[RankInfo]) -> list[str | None]:
        """Workers on one node see all of that node's group GPUs, so local_rank indexes
        them and NCCL can use peer-to-peer links."""
        if not self._scaling.use_gpu:
            return [None] * len(self._workers)
        per_node: dict[str, list[str]] = defaultdict(list)
        for node in self._nodes:
            per_node[node["node_id"]].extend(node["gpu_ids"])
        return [",".join(per_node[node["node_id"]]) for node in self._nodes]

    def _get(self, refs: list[Any], timeout: float, what: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise WorkerStartError(
                f"workers did not {what} within FailureConfig.worker_start_timeout_s="
                f"{timeout:g}s; raise it if workers are slow to import or the cluster is busy"
            ) from None
        except RayError as exc:
            raise WorkerStartError(f"a worker failed to {what}: {exc}") from None

    # -- poll -----------------------------------------------------------------------
    def poll(self) -> GroupPoll:
        refs = [w.poll.remote() for w in self._workers]
        timeout = self._failure.health_check_timeout_s
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        ready_set = set(ready)
        polls: list[WorkerPoll] = []
        failures: list[WorkerFailure] = []
        for rank, ref in enumerate(refs):
            node = self._nodes[rank] if rank < len(self._nodes) else {}
            where: dict[str, Any] = {"node": node.get("ip"), "pid": node.get("pid")}
            if ref not in ready_set:
                failures.append(
                    WorkerFailure(
                        rank,
                        "hang",
                        f"did not answer a health check within "
                        f"FailureConfig.health_check_timeout_s={timeout:g}s",
                        **where,
                    )
                )
                continue
            try:
                poll: WorkerPoll = ray.get(ref)
            except RayActorError as exc:
                failures.append(WorkerFailure(rank, "died", _death_reason(exc), **where))
                continue
            polls.append(poll)
            if poll.state == "errored" and poll.error is not None:
                failures.append(
                    WorkerFailure(
                        rank,
                        "error",
                        f"raised {poll.error.exc_type}: {poll.error.message}",
                        error=poll.error,
                        **where,
                    )
                )
            elif poll.state == "running" and poll.seconds_since_progress > self._failure.hang_timeout_s:
                failures.append(
                    WorkerFailure(
                        rank,
                        "hang",
                        f"made no progress for {poll.seconds_since_progress:.0f}s "
                        f"(FailureConfig.hang_timeout_s={self._failure.hang_timeout_s:g}s)",
                        seconds_since_progress=poll.seconds_since_progress,
                        **where,
                    )
                )
        return GroupPoll(polls, GroupPoll.root_cause_first(failures))

    # -- shutdown -------------------------------------------------------------------
    def shutdown(self) -> None:
        for actor in self._workers:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead
                pass
        self._workers = []
        self._nodes = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
            self._pg = None


def _death_reason(exc: RayActorError) -> str:
    text = str(exc).strip()
    for marker in ("SIGKILL", "out of memory", "OOM", "node", "exit"):
        for line in text.splitlines():
            if marker.lower() in line.lower():
                return f"died: {line.strip()}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"died: {first}"

"""The nodes the scheduler may give out: Ray's alive nodes, less those leaving.

A node Ray is draining (``ray drain-node``, the autoscaler, a cloud's preemption through
KubeRay: the GCS drain state the worker groups read, ``worker_group.placement``) or one
Ray has marked dead leaves the allocation at once: every answer the scheduler gives is
computed on the nodes this module returns at that moment, so the next report of each
job (and, in cloud mode, the next decision) re-allocates without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raylight.base.cost import HEAD_RESOURCE, node_type_of

_BOOKKEEPING = ("memory", "object_store_memory")


@dataclass(frozen=True)
class NodeInfo:
    """One schedulable node: its id, type (the autoscaler's name, ``head``, or its shape),
    total resources, and whether it is the head (never let go)."""

    node_id: str
    node_type: str
    resources: Mapping[str, float]
    head: bool

    def shape(self) -> dict[str, float]:
        """The node's resources as an autoscaler bundle (no node:..., memory or accelerator keys)."""
        return bundle_of(self.resources)


def bundle_of(resources: Mapping[str, float]) -> dict[str, float]:
    return {
        k: float(v) for k, v in resources.items()
        if v and not k.startswith("node:") and not k.startswith("accelerator_type:") and k not in _BOOKKEEPING
    }


def schedulable(
    raw: list[dict[str, Any]], draining: Callable[[], Mapping[str, Any]],
) -> list[NodeInfo]:
    """The alive nodes of ``raw`` (``ray.nodes()``'s form) that are not being drained."""
    leaving = set(draining()) if raw else set()
    out = []
    for node in raw:
        if not node.get("Alive") or node.get("NodeID") in leaving:
            continue
        resources = {str(k): float(v) for k, v in (node.get("Resources") or {}).items()}
        out.append(NodeInfo(
            str(node["NodeID"]), node_type_of(node.get("Labels") or {}, resources), resources,
            bool(resources.get(HEAD_RESOURCE)),
        ))
    return sorted(out, key=lambda n: n.node_id)


def cluster_nodes() -> list[NodeInfo]:
    """The connected cluster's schedulable nodes (two GCS calls, milliseconds)."""
    import ray

    from raylight.worker_group.placement import draining_nodes

    return schedulable(ray.nodes(), draining_nodes)


def alive_nodes() -> dict[str, dict[str, float]]:
    """Each schedulable node's total resources, by node id (``SchedulerState``'s nodes)."""
    return {n.node_id: dict(n.resources) for n in cluster_nodes()}

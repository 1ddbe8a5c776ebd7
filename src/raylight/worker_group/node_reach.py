"""Whether every node work may be placed on sees a directory of the driver's, asked before
the work starts (issue 57).

``raylight hyperopt`` has Ray Tune place its trials on any node with room, and each trial
writes its checkpoints and results into the search's output directory from where it runs.
An output directory on the driver's own disk then holds only the trials placed on the
driver's node; the rest are written on their nodes' disks (or fail there) and are lost to
the search. A worker group checks its own workers (``RayWorkerGroup._check_reach``); here
no worker exists yet, so a zero-CPU task is pinned to each node instead: the driver writes
a marker (``raylight.storage.reach``), each node looks for it at the same path.
"""

from __future__ import annotations

import socket
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raylight.base.exceptions import ClusterConnectionError
from raylight.storage.reach import marker, unseen

# How long the nodes have to answer where they look for the marker: a zero-CPU task
# starts in a fraction of a second on a node with a worker process to spare, a few
# seconds where one must start.
NODE_REACH_TIMEOUT_S = 60.0


def _look(path: str, token: str) -> tuple[str, str | None]:
    return socket.gethostname(), unseen(path, token)


def nodes_not_seeing(path: str, *, timeout_s: float = NODE_REACH_TIMEOUT_S) -> dict[str, str]:
    """``"host (address)" -> what it found`` for each live node that does not see ``path``
    as the driver does; empty where every one does or ``path`` is an object store's URI.
    The connected Ray is asked."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    look: Any = ray.remote(num_cpus=0)(_look)
    with marker(path) as mark:
        if mark is None or not nodes:
            return {}
        refs = [
            look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                mark.path, mark.token
            )
            for n in nodes
        ]
        try:
            found = ray.get(refs, timeout=timeout_s)
        except GetTimeoutError:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise ClusterConnectionError(
                f"the cluster's nodes did not say within {timeout_s:g}s whether they see {path} "
                "(raylight.worker_group.node_reach.NODE_REACH_TIMEOUT_S); is every node alive (`ray status`)?"
            ) from None
    return {
        f"{host} ({n['NodeManagerAddress']})": why
        for n, (host, why) in zip(nodes, found, strict=True)
        if why is not None
    }

"""Cloud mode in the simulator: raylight.adaptive.cloud.CloudPlanner grows and shrinks the cluster.

The cluster has up to ``max_nodes`` node slots of 4 GPUs; a slot is off (0 GPUs, no cost)
until the planner asks for a node, which joins ``join_s`` later (a cloud VM's start), and
goes off when the planner lets it go. Every interval, before the policy divides the GPUs,
the planner sees the jobs' models (the sharing policy's, ``policies.job_model``, their
replicas re-indexed onto the nodes that are on) and decides. The cost is node-hours x
``price_per_node_h``, every node on counted, busy or not.
"""

from __future__ import annotations

import dataclasses
import time

from raylight.adaptive.cloud import CloudNode, CloudPlanner, CloudSettings, NodeType
from raylight.adaptive.sharing import SharingPolicy

from .cluster import Scale, SimJob
from .policies import job_model, ranked

NODE_TYPE = "gpu4"


def autoscaler(
    *, policy: SharingPolicy, settings: CloudSettings, price_per_node_h: float, max_nodes: int = 16,
    gpus_per_node: int = 4, join_s: float = 60.0, restart_s: float = 30.0, order: str = "service",
    timings: list[float] | None = None,
) -> Scale:
    """The simulator's ``scale`` for cloud mode (``timings`` collects each plan's seconds)."""
    planner = CloudPlanner(policy, settings)
    joining: dict[int, float] = {}  # node slot -> when it joins
    on: set[int] = set()
    types = [NodeType(NODE_TYPE, gpus_per_node, price_per_node_h, max_count=max_nodes)]

    def scale(now: float, jobs: list[SimJob], slots: list[int]) -> list[int]:
        for node, at in list(joining.items()):
            if at <= now:
                on.add(node)
                del joining[node]
        order_on = sorted(on)
        index = {node: i for i, node in enumerate(order_on)}
        models = [dataclasses.replace(m, current=tuple(index[n] for n in m.current if n in index))
                  for m in (job_model(j, restart_s) for j in ranked(jobs, order))]
        nodes = [CloudNode(str(node), NODE_TYPE, gpus_per_node) for node in order_on]
        t0 = time.perf_counter()
        decision = planner.decide(now, models, nodes, types)
        if timings is not None:
            timings.append(time.perf_counter() - t0)
        for name in decision.release:
            on.discard(int(name))
        want = decision.wanted.get(NODE_TYPE, 0)
        while len(on) + len(joining) > want and joining:  # no longer asked for: not started
            joining.pop(max(joining))
        free = [n for n in range(max_nodes) if n not in on and n not in joining]
        for node in free[: max(want - len(on) - len(joining), 0)]:
            joining[node] = now + join_s
        return [gpus_per_node if n in on else 0 for n in range(max_nodes)]

    return scale

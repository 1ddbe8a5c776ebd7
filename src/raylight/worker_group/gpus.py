"""Which GPU each worker trains on. Pure: no Ray, no CUDA.

The workers of one node see all the GPUs Ray gave the group's workers on that node
(``CUDA_VISIBLE_DEVICES`` is their union, in the order of the workers' ranks), so NCCL can
use the peer-to-peer links between them. Each worker trains on the first GPU Ray gave it,
found by its position in that list: not ``local_rank``, which names another worker's GPU
as soon as a worker has more than one. CUDA reads the list once, when it starts in the
process: a worker whose CUDA has started (a survivor of an in-place resize) keeps the list
it started with and finds its GPU there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def node_visible_devices(nodes: Sequence[dict[str, Any]]) -> list[str]:
    """Each member's ``CUDA_VISIBLE_DEVICES``: the union of its node's members' GPU ids,
    each once, in rank order. ``nodes``: the members' ``node_info`` in rank order."""
    per_node: dict[str, list[str]] = {}
    for node in nodes:
        ids = per_node.setdefault(node["node_id"], [])
        ids.extend(g for g in node["gpu_ids"] if g not in ids)
    return [",".join(per_node[node["node_id"]]) for node in nodes]


def cuda_index(visible: str | None, own: Sequence[str]) -> int:
    """The index, among the GPUs ``visible`` (a ``CUDA_VISIBLE_DEVICES`` value; None or
    empty: Ray's own setting, the worker's GPUs alone), of the first GPU Ray gave this
    worker (``own``, its ``ray.get_gpu_ids()``)."""
    if not visible or not own:
        return 0
    listed = [g.strip() for g in visible.split(",")]
    if own[0] not in listed:
        raise RuntimeError(
            f"this worker's GPU {own[0]} is not among the GPUs CUDA started with "
            f"(CUDA_VISIBLE_DEVICES={visible}); CUDA was started in this process before raylight set it"
        )
    return listed.index(own[0])

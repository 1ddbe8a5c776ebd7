"""Whether this driver is a Ray Client driver (``ray://``): the worker group then runs
its calls to Ray's state and autoscaler APIs in a task on the cluster, and a declarative
run reads local files on the driver's node only where that node is in the cluster."""

from __future__ import annotations


def client_driver() -> bool:
    """Whether this driver reaches its cluster through Ray Client (``ray://``): it then has
    no GCS connection of its own (which Ray's state and autoscaler APIs need), and its
    machine's files are not on the cluster."""
    try:
        from ray.util.client import ray as client

        return bool(client.is_connected())
    except Exception:
        return False

"""raylight on a Ray cluster over fake hosts: the head on a (no CPU), raylets on the others."""

from __future__ import annotations

import json
import os

import pytest

from tests.hosts.harness import SHARED
from tests.hosts.ray_cluster import RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]
HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = "raylight.worker.strategies.shm_allreduce.comm_hook"


@pytest.mark.parametrize(
    ("raylets", "hosts", "hooks"),
    [({"b": 1, "c": 1}, ["b", "c"], ""), ({"b": 2}, ["b", "b"], HOOK)],
    ids=["two-hosts-gloo", "one-host-shared-memory"],
)
def test_ddp_across_hosts_matches_one_process_and_shares_memory_only_within_a_host(
    make_hosts, raylets, hosts, hooks
):
    """Two workers, one on each of b and c: gloo alone (the shared-memory path sees two hosts);
    both on b: the shared-memory hook. The same parameters as one process either way."""
    made = make_hosts(["a", *raylets], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets=raylets)
    out = json.loads(
        cluster.driver(os.path.join(HERE, "ddp_driver.py"), f"{SHARED}/runs").splitlines()[-1]
    )
    assert out["metrics"]["world_size"] == 2
    assert out["metrics"]["hosts"] == hosts
    assert out["metrics"]["hooks"] == hooks
    assert out["diff"] < 1e-5

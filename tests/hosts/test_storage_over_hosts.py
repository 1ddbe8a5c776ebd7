"""The run's storage across hosts (issue 57): sharded checkpoints need storage every worker
reaches. The driver on a (the head, no CPU), workers on b and c; the shared directory is what
NFS gives a cluster, each host's /tmp its own disk."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.hosts.harness import RUN, SHARED
from tests.hosts.ray_cluster import RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "fsdp_driver.py")


def _fit(cluster: RayOverHosts, *args: str) -> dict:
    return json.loads(cluster.driver(DRIVER, *map(str, args)).splitlines()[-1])


def test_a_sharded_run_on_the_driver_s_own_disk_fails_before_training_naming_the_storage_it_needs(make_hosts):
    """storage_path in a's private /tmp, workers on b and c: a ConfigError from fit (not a
    failure retried under max_failures=3), before any loop starts or the run directory appears."""
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    out = _fit(cluster, f"{RUN}/runs", "local", 2, 2)
    assert out["error"] == "raylight.base.exceptions.ConfigError", out
    message = out["message"]
    for part in ("RunConfig.storage_path", f"{RUN}/runs/local", "on b (198.18.0.", "on c (198.18.0.",
                 "does not exist here", "shared filesystem", "s3://", "checkpoint='full'"):
        assert part in message, (part, message)
    assert not out["run_dir"], "the run directory appears only when training starts"
    leftovers = [n for n in os.listdir(f"/proc/{made.hosts['a'].holder.pid}/root{RUN}") if n.startswith(".raylight")]
    assert not leftovers, f"the driver's marker stays behind: {leftovers}"


@pytest.mark.beside  # an equality after resumes, no deadline a slower CPU could trip: with the run beside (tests/suite.py)
def test_fsdp_on_the_shared_directory_resumes_on_one_worker_on_another_host_equal_to_an_uninterrupted_run(make_hosts):
    """Two workers (b, c) write sharded checkpoints into the shared directory: an uninterrupted
    run of 5 epochs, and one stopped after 2. Then b and c die, d joins, and the second resumes
    there on one worker: its parameters equal the uninterrupted run's."""
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    runs = f"{SHARED}/runs"
    whole = _fit(cluster, runs, "whole", 2, 5)
    assert "error" not in whole, whole
    part = _fit(cluster, runs, "resized", 2, 2)
    assert "error" not in part, part
    for out in (whole, part):  # every rank wrote its shards; the driver on a committed them
        assert out["sharded"] and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(out["files"]), out
    made.kill_host("b")
    made.kill_host("c")
    cluster.add_raylet("d", cpus=1)
    cluster.wait_alive(["a", "d"])
    resized = _fit(cluster, runs, "resized", 1, 5, "resume")
    assert "error" not in resized, resized
    assert resized["starts"][-3:] == [2, 2, 2], resized["starts"]
    assert resized["num_failures"] == 0
    for key, want in whole["model"].items():
        got = torch.tensor(resized["model"][key])
        assert (torch.tensor(want) - torch.tensor(part["model"][key])).abs().max() > 1e-3, "the resume has work to do"
        # the same global batches; one worker sums them in another order than two
        assert torch.allclose(got, torch.tensor(want), atol=1e-5, rtol=0), key

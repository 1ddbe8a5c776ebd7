"""DeepSpeed ZeRO-3 across hosts (issue 57), on CPUs over gloo: two workers (b, c) write
sharded checkpoints into the shared directory (what NFS gives a cluster), and a run stopped
after 2 epochs resumes on one worker on another host (d) equal to an uninterrupted run. The
same on s3://: tests/hosts/test_s3_over_hosts.py."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.hosts.harness import SHARED
from tests.hosts.ray_cluster import RayOverHosts, cluster_env, start_ray

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.hosts, pytest.mark.timeout(540)]
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_driver.py")


def _fit(cluster: RayOverHosts, *args) -> dict:
    return json.loads(cluster.driver(DRIVER, *map(str, args), "deepspeed").splitlines()[-1])


@pytest.mark.extended  # three runs across hosts (56 s quiet): make test-extended; ZeRO-3 on s3:// is in make test (test_s3_over_hosts.py)
@pytest.mark.timeout(900)
def test_zero3_on_the_shared_directory_resumes_on_one_worker_on_another_host_equal_to_an_uninterrupted_run(make_hosts):
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = start_ray(made, head="a", raylets={"b": 1, "c": 1})
    runs = f"{SHARED}/runs"
    whole = _fit(cluster, runs, "whole", 2, 4)
    assert "error" not in whole, whole
    part = _fit(cluster, runs, "resized", 2, 2)
    assert "error" not in part, part
    for out in (whole, part):  # every rank wrote its shards; the driver on a committed them
        assert out["sharded"] and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(out["files"]), out
    made.kill_host("b")
    made.kill_host("c")
    cluster.add_raylet("d", cpus=1)
    cluster.wait_alive(["a", "d"])
    resized = _fit(cluster, runs, "resized", 1, 4, "resume")
    assert "error" not in resized, resized
    assert resized["starts"][-2:] == [2, 2], resized["starts"]
    assert resized["num_failures"] == 0
    for key, want in whole["model"].items():
        got = torch.tensor(resized["model"][key])
        assert (torch.tensor(want) - torch.tensor(part["model"][key])).abs().max() > 1e-3, "the resume has work to do"
        # fp32 Adam, the same global batches; one worker sums them in another order than two
        assert torch.allclose(got, torch.tensor(want), atol=1e-5, rtol=0), key

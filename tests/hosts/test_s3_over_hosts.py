"""The run's storage on an object store across hosts (issue 57): moto's S3 server on host s
(tests/hosts/s3.py), its endpoint and credentials handed to each host as an admin would. The
driver on a (the head, no CPU), workers on b and c. The reach check (storage/reach.py)
writes a marker into the store and every worker must read it back; a worker whose host has
no route to the endpoint is a ConfigError before training, naming that host."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.hosts.ray_cluster import RayOverHosts, cluster_env, start_ray
from tests.hosts.s3 import S3OnHost, files_holding

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "fsdp_driver.py")


@pytest.fixture
def s3_on(make_hosts):
    """``s3_on(hosts, "s")``: an S3 server on host s, stopped by its PID after the test (before
    the hosts' teardown) and checked gone."""
    started: list[S3OnHost] = []

    def start(hosts, host) -> S3OnHost:
        server = S3OnHost(hosts, host)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
        assert server.proc.poll() is not None


def _fit(cluster: RayOverHosts, *args) -> dict:
    return json.loads(cluster.driver(DRIVER, *map(str, args)).splitlines()[-1])


def _s3_cluster(make_hosts, s3_on, names=("a", "b", "c", "s")):
    made = make_hosts(list(names), env=cluster_env())
    s3 = s3_on(made, "s")
    s3.hand_to("a", "b", "c")
    return made, s3, start_ray(made, head="a", raylets={"b": 1, "c": 1})


def _assert_secret_kept(made, s3, *outputs: str) -> None:
    """The secret is in the admin's ~/.aws files alone: not in the store, not in any file of
    any host (run files, Ray's and raylight's logs), not in what the driver printed."""
    stored = {key for key, data in s3.objects().items() if s3.secret in data}
    assert not stored, f"the secret was stored in {stored}"
    assert not files_holding(made, s3.secret), files_holding(made, s3.secret)
    for out in outputs:
        assert s3.secret not in out


def test_a_worker_whose_host_cannot_reach_the_object_store_is_refused_before_training_and_one_that_can_trains(make_hosts, s3_on):
    """b loses its route to s: a ConfigError from fit naming b and the endpoint (not c), before
    any loop starts (max_failures=3 does not retry it). The route back, the same run trains
    with its sharded checkpoints in the store, and no file anywhere holds the secret."""
    made, s3, cluster = _s3_cluster(make_hosts, s3_on)
    runs = s3.uri("runs")
    made.block("b", "s")
    refused = _fit(cluster, runs, "reach", 2, 1)
    assert refused["error"] == "raylight.base.exceptions.ConfigError", refused
    message = refused["message"]
    for part in ("RunConfig.storage_path", f"{runs}/reach", "not reached by every worker", "on b (198.18.0.",
                 s3.endpoint, "AWS_ENDPOINT_URL", "route to the endpoint"):
        assert part in message, (part, message)
    assert "on c (" not in message, message
    assert not [k for k in s3.objects() if "/reach/" in k and ".raylight-reach-" not in k], "nothing trained"
    assert not [k for k in s3.objects() if ".raylight-reach-" in k], "the driver's marker is removed"
    made.unblock("b", "s")
    done = _fit(cluster, runs, "reach", 2, 2)
    assert "error" not in done, done
    assert done["sharded"] and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(done["files"]), done
    shards = [k for k in s3.objects() if k.endswith(".distcp")]
    assert any("/reach/checkpoints/checkpoint_000001/" in k for k in shards), shards
    _assert_secret_kept(made, s3, message, json.dumps(done))


@pytest.mark.beside  # an equality after resumes, no deadline a slower CPU could trip: with the run beside (tests/suite.py)
@pytest.mark.timeout(900)
# three runs across hosts each (50-60 s quiet): DeepSpeed in make test, FSDP (make test-extended) has the
# shared directory's FSDP resume in make test (test_storage_over_hosts.py)
@pytest.mark.parametrize("strategy", [pytest.param("fsdp", marks=pytest.mark.extended), "deepspeed"])
def test_sharded_checkpoints_on_s3_resume_on_one_worker_on_another_host_equal_to_an_uninterrupted_run(make_hosts, s3_on, strategy):
    """Two workers (b, c) write sharded checkpoints into s3://: an uninterrupted run of 4
    epochs, and one stopped after 2. Then b and c die, d joins (handed the store's settings),
    and the second resumes there on one worker: its parameters equal the uninterrupted run's."""
    made, s3, cluster = _s3_cluster(make_hosts, s3_on, names=("a", "b", "c", "s", "d"))
    flags = ["deepspeed"] if strategy == "deepspeed" else []
    runs = s3.uri("runs")
    whole = _fit(cluster, runs, "whole", 2, 4, *flags)
    assert "error" not in whole, whole
    part = _fit(cluster, runs, "resized", 2, 2, *flags)
    assert "error" not in part, part
    for out in (whole, part):  # every rank wrote its shards into the store; the driver committed them
        assert out["sharded"] and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(out["files"]), out
    made.kill_host("b")
    made.kill_host("c")
    s3.hand_to("d")
    cluster.add_raylet("d", cpus=1)
    cluster.wait_alive(["a", "d"])
    resized = _fit(cluster, runs, "resized", 1, 4, "resume", *flags)
    assert "error" not in resized, resized
    assert resized["starts"][-2:] == [2, 2], resized["starts"]
    assert resized["num_failures"] == 0
    for key, want in whole["model"].items():
        got = torch.tensor(resized["model"][key])
        assert (torch.tensor(want) - torch.tensor(part["model"][key])).abs().max() > 1e-3, "the resume has work to do"
        # the same global batches; one worker sums them in another order than two
        assert torch.allclose(got, torch.tensor(want), atol=1e-5, rtol=0), key
    _assert_secret_kept(made, s3, json.dumps(resized))

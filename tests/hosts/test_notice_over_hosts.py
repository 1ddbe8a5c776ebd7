"""A preemption notice across hosts (issue 57): the head on a (no CPU, the driver), one
worker on each of b and c; b is drained the way a cloud's preemption reaches Ray
(``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds``, run
on a as an admin would) and taken away at its deadline."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tests.helpers import read_trace, wait_until
from tests.hosts.ray_cluster import VENV_BIN, RayOverHosts, cluster_env
from tests.hosts.test_cluster_over_hosts import _elastic_driver_mid_epoch, _positions

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(300)]
DEADLINE_S = 10


def node_id(cluster: RayOverHosts, host: str) -> str:
    """The Ray node id of ``host``'s raylet, asked on the head."""
    probe = (
        "import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "print(next(n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerAddress'] == sys.argv[2]))"
    )
    args = [sys.executable, "-c", probe, cluster.address, cluster.hosts.address(host)]
    return cluster.hosts.run(cluster.head, args, timeout=60).stdout.split()[-1]


def _segments(steps: list[list[int]]) -> list[tuple[int, set[tuple[int, int]]]]:
    """Runs of consecutive steps at one world size: [(world_size, {(epoch, cursor), ...})]."""
    out: list[tuple[int, set[tuple[int, int]]]] = []
    for epoch, cursor, world in steps:
        if not out or out[-1][0] != world:
            out.append((world, set()))
        out[-1][1].add((epoch, cursor))
    return out


def test_a_drained_host_s_worker_is_checkpointed_at_the_notice_and_the_run_shrinks_onto_the_other_host(make_hosts):
    """Both workers mid-epoch, b is drained with a 10 s deadline, then all of b's processes are
    killed at the deadline (the cloud takes the machine). The run shrinks in place onto c
    before the deadline from the snapshot taken at the notice: no failure counted, no step
    trained twice (only the notice window's step in flight is lost), each epoch sees every
    sample once."""
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    victim = node_id(cluster, "b")
    driver = _elastic_driver_mid_epoch(made, cluster)
    run_dir = os.path.join(made.shared, "runs", "elastic")
    try:
        asked_at = time.time()
        made.run("a", [os.path.join(VENV_BIN, "ray"), "drain-node", "--address", cluster.address, "--node-id", victim,
                       "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot preemption (test)",
                       "--deadline-remaining-seconds", str(DEADLINE_S)], timeout=60)
        answered_at = time.time()  # the CLI set the deadline in between
        wait_until(
            lambda: any(r.get("event") == "resized" for r in read_trace(run_dir)) or driver.poll() is not None,
            120, "the shrink after the notice",
        )
        shrunk_at = time.time()
        deadline = next((r["deadline"] for r in read_trace(run_dir) if r.get("event") == "notice"), answered_at + DEADLINE_S)
        while time.time() < deadline:  # the cloud takes b at its deadline
            time.sleep(0.05)
        made.kill_host("b")
        gone_at = len(_positions(made.shared))
        wait_until(
            lambda: sum(p[2] == 1 for p in _positions(made.shared)[gone_at:]) >= 10 or driver.poll() is not None,
            120, "the run on c after b went",
        )
    finally:
        open(os.path.join(made.shared, "stop"), "w").close()
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-5000:]
    data = json.loads(out.splitlines()[-1])
    assert data["num_failures"] == 0, err[-3000:]
    notices = [r for r in read_trace(run_dir) if r.get("event") == "notice"]
    assert [(n["node"], n["source"]) for n in notices] == [(victim, "drain")], notices
    assert asked_at + DEADLINE_S - 1 < notices[0]["deadline"] < answered_at + DEADLINE_S + 1, notices
    assert shrunk_at < deadline, "the run shrank before the deadline"
    moves = [(r["from"], r["to"], r["kind"]) for r in data["resizes"]]
    assert moves[0] == (2, 1, "in_place"), (moves, err[-3000:])
    assert "preemption notice" in data["resizes"][0]["reason"], data["resizes"][0]
    runs = _segments(_positions(made.shared))
    worlds = [w for w, _ in runs]
    shrink = next((i for i in range(len(runs) - 1) if worlds[i : i + 2] == [2, 1]), None)
    assert shrink is not None and worlds[shrink + 1 :] == [1], worlds
    assert not runs[shrink][1] & runs[shrink + 1][1], "the snapshot at the notice: no step ran twice"
    n = 240
    for m in data["epochs"]:
        assert (m["count"], m["sum"]) == (n, n * (n - 1) / 2), m
    assert {m["workers"] for m in data["epochs"]} >= {1}

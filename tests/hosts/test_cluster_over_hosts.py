"""raylight on a Ray cluster over fake hosts: the head on a (no CPU), raylets on the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import wait_until
from tests.hosts.harness import SHARED
from tests.hosts.ray_cluster import RAY_OWN_PORTS, RayOverHosts, cluster_env

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
    assert sorted(out["metrics"]["hosts"]) == hosts  # rank order is the placement's
    assert out["metrics"]["hooks"] == hooks
    assert out["diff"] < 1e-5


def test_every_listener_raylight_starts_binds_the_host_s_own_address_or_loopback(make_hosts):
    """Driver on a, workers on b and c, held in their first epoch while each host's listeners are
    listed: against what each host had before the run (Ray's own), nothing new on all interfaces."""
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    before = {h: set(made.listening(h)) for h in made.hosts}
    env_cmd = [
        "env",
        f"RAY_ADDRESS={cluster.address}",
        sys.executable,
        os.path.join(HERE, "listen_driver.py"),
        SHARED,
    ]
    driver = made.popen("a", env_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(
            lambda: (
                all(os.path.exists(os.path.join(made.shared, f"held-{r}")) for r in (0, 1))
                or driver.poll() is not None
            ),
            240,
            "both workers held in their first epoch",
        )
        assert driver.poll() is None, driver.stdout.read()
        new = {h: sorted(set(made.listening(h)) - before[h]) for h in made.hosts}
        owners = {h: made.listener_owners(h) for h in made.hosts}
    finally:
        open(os.path.join(made.shared, "go"), "w").close()
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, out
    allowed = {
        h: {made.address(h), "127.0.0.1", "::1", "::ffff:127.0.0.1", f"::ffff:{made.address(h)}"}
        for h in made.hosts
    }
    ray_own = {
        h: [(a, p) for a, p in new[h] if a == "::" and p in RAY_OWN_PORTS] for h in made.hosts
    }
    assert all(ray_own.values()), (
        f"Ray's core workers' listeners are seen (driver and workers): {new}"
    )
    ours = {h: [(a, p) for a, p in new[h] if (a, p) not in ray_own[h]] for h in made.hosts}
    wide = {
        h: [(a, p, owners[h].get((a, p))) for a, p in ours[h] if a not in allowed[h]]
        for h in made.hosts
    }
    assert ours["b"] and ours["c"], (
        f"the workers' own listeners are seen (the check sees them): {new}"
    )
    assert not any(wide.values()), (
        f"listeners on all interfaces (or another address) during the run: {wide}; all new: {new}"
    )


def _positions(shared: str) -> list[list[int]]:
    try:
        with open(os.path.join(shared, "positions")) as f:
            return [list(map(int, line.split())) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _elastic_driver_mid_epoch(made, cluster, *args: str) -> subprocess.Popen:
    """elastic_driver.py started on a (``args`` after the shared directory), once both
    workers are mid-epoch; the caller stops it."""
    cmd = ["env", f"RAY_ADDRESS={cluster.address}", sys.executable, os.path.join(HERE, "elastic_driver.py"), SHARED, *args]
    driver = made.popen("a", cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(
            lambda: sum(p[2] == 2 for p in _positions(made.shared)) >= 8 or driver.poll() is not None,
            240,
            "2 workers mid-epoch",
        )
        assert driver.poll() is None, driver.communicate()
    except BaseException:
        open(os.path.join(made.shared, "stop"), "w").close()  # as the callers' finally does
        raise
    return driver


def test_a_host_that_dies_mid_epoch_shrinks_the_run_onto_the_survivor_and_it_regrows_when_a_host_joins(
    make_hosts,
):
    """Driver on a, one worker on each of b and c; every process of c is killed mid-epoch (the
    machine dies): the run goes on with the worker on b; then a raylet on d joins (a machine
    added) and the run grows back onto it; each epoch sees every sample once throughout."""
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    driver = _elastic_driver_mid_epoch(made, cluster)
    try:
        killed_at = len(_positions(made.shared))
        made.kill_host("c")
        wait_until(
            lambda: (
                sum(p[2] == 1 for p in _positions(made.shared)[killed_at:]) >= 20
                or driver.poll() is not None
            ),
            240,
            "the run on the survivor",
        )
        assert driver.poll() is None, driver.communicate()
        joined_at = len(_positions(made.shared))
        cluster.add_raylet("d", 1)
        wait_until(
            lambda: (
                sum(p[2] == 2 for p in _positions(made.shared)[joined_at:]) >= 20
                or driver.poll() is not None
            ),
            240,
            "the run grown back onto d",
        )
    finally:
        open(os.path.join(made.shared, "stop"), "w").close()
    out, err = driver.communicate(timeout=240)
    assert driver.returncode == 0, err[-5000:]
    data = json.loads(out.splitlines()[-1])
    moves = [(r["from"], r["to"]) for r in data["resizes"]]
    assert (2, 1) in moves and (1, 2) in moves[moves.index((2, 1)):], (moves, err[-3000:])
    n = 240
    for m in data["epochs"]:
        assert (m["count"], m["sum"]) == (n, n * (n - 1) / 2), m
    assert {m["workers"] for m in data["epochs"]} >= {1}


# Short timeouts for the partition test, set through the run's FailureConfig: a silent worker
# is found within a health check; the survivor's collective with it ends within
# collective_timeout_s; hang_timeout_s is the bound the test holds the run's notice to.
PARTITION_FAILURE = {
    "health_check_timeout_s": 3.0,
    "collective_timeout_s": 6.0,
    "hang_timeout_s": 20.0,
    "max_failures": 0,  # a failure ends the run: only a resize gets past the cut
}


def _worker_pids(made, host: str) -> list[int]:
    """The host's processes running a raylight worker actor (Ray titles them ``ray::RaylightWorker``)."""
    pids = []
    for pid in made.pids(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::RaylightWorker"):
                    pids.append(pid)
        except OSError:
            pass
    return pids


def test_a_host_cut_off_mid_epoch_is_dropped_and_the_run_shrinks_onto_the_survivor(make_hosts):
    """Driver on a, one worker on each of b and c; c's link goes down mid-epoch (its processes
    live on, unreachable): the run notices within hang_timeout_s, goes on with the worker on b
    (each epoch seeing every sample once, no failure counted), and when c's link comes back the
    old worker's late answers change nothing and its actor is killed."""
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    driver = _elastic_driver_mid_epoch(made, cluster, json.dumps(PARTITION_FAILURE))
    try:
        assert _worker_pids(made, "c"), "a worker runs on c before the cut"
        # The driver's clock (time.monotonic, one kernel for every host) stamps its decision.
        cut_at, cut_clock = len(_positions(made.shared)), time.monotonic()
        made.cut("c")
        wait_until(
            lambda: (
                sum(p[2] == 1 for p in _positions(made.shared)[cut_at:]) >= 10
                or driver.poll() is not None
            ),
            120,
            "the run on the survivor",
        )
        made.restore("c")  # the old worker's answers may now arrive late
        restored_at = len(_positions(made.shared))
        wait_until(
            lambda: not _worker_pids(made, "c") or driver.poll() is not None,
            60,
            "the cut-off worker's actor killed once c is back",
        )
        wait_until(
            lambda: (
                sum(p[2] == 1 for p in _positions(made.shared)[restored_at:]) >= 10
                or driver.poll() is not None
            ),
            120,
            "the run going on after the link is back",
        )
    finally:
        made.restore("c")
        open(os.path.join(made.shared, "stop"), "w").close()
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-5000:]
    data = json.loads(out.splitlines()[-1])
    assert data["num_failures"] == 0, err[-3000:]
    shrinks = [r for r in data["resizes"] if (r["from"], r["to"]) == (2, 1)]
    assert shrinks, (data["resizes"], err[-3000:])
    assert shrinks[0]["kind"] == "in_place", shrinks[0]
    noticed_s = shrinks[0]["decided_at"] - cut_clock
    assert 0 < noticed_s < PARTITION_FAILURE["hang_timeout_s"], (noticed_s, shrinks[0])
    n = 240
    for m in data["epochs"]:
        assert (m["count"], m["sum"]) == (n, n * (n - 1) / 2), m
    assert {m["workers"] for m in data["epochs"]} >= {1}

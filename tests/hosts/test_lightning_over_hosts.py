"""A Lightning Trainer with RayStrategy across hosts (issue 57): the driver on a (the head,
no CPU), its two workers on b and c; the loggers and the checkpoint write on the workers'
hosts, not the driver's."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tests.hosts.harness import RUN, SHARED
from tests.hosts.ray_cluster import RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(720)]  # 37 s quiet, 3-6 min at load 30
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "lightning_driver.py")


def test_lightning_loggers_on_the_workers_hosts_get_the_version_resolved_where_rank_0_writes(make_hosts):
    """On the shared directory: version_0 of both loggers and the checkpoint are there, where
    the driver's Trainer says. Then under a path each host has on its own disk, where b and c
    already hold a version_0 of an earlier run and a (the driver) holds none: rank 0 writes
    version_1 beside it, the earlier run untouched, and the driver's loggers say version_1
    (resolved on the driver's disk, the version was 0, and rank 0 wrote into the earlier run)."""
    pytest.importorskip("lightning.pytorch")
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})

    shared = json.loads(cluster.driver(DRIVER, f"{SHARED}/lt", timeout=300).splitlines()[-1])
    logs = [f"{SHARED}/lt/csv/lightning_logs/version_0", f"{SHARED}/lt/tb/lightning_logs/version_0"]
    assert shared["versions"] == [0, 0] and shared["log_dirs"] == logs and shared["log_dir"] == logs[0], shared
    on_box = made.shared + "/lt"
    assert os.path.isfile(f"{on_box}/csv/lightning_logs/version_0/metrics.csv"), os.listdir(on_box)
    assert glob.glob(f"{on_box}/tb/lightning_logs/version_0/events.out.tfevents.*")
    assert shared["best"].startswith(f"{SHARED}/lt/ckpt/") and os.path.isfile(on_box + shared["best"][len(f"{SHARED}/lt"):])

    def disk(host: str) -> str:  # the host's own /tmp, seen from the box
        return f"/proc/{made.hosts[host].holder.pid}/root{RUN}/lt"

    for host in ("b", "c"):  # an earlier run on the workers' own disks
        for kind in ("csv", "tb"):
            os.makedirs(f"{disk(host)}/{kind}/lightning_logs/version_0")
            with open(f"{disk(host)}/{kind}/lightning_logs/version_0/earlier", "w") as f:
                f.write("an earlier run")
    local = json.loads(cluster.driver(DRIVER, f"{RUN}/lt", timeout=300).splitlines()[-1])
    assert local["versions"] == [1, 1], local
    assert local["log_dirs"] == [f"{RUN}/lt/csv/lightning_logs/version_1", f"{RUN}/lt/tb/lightning_logs/version_1"], local
    wrote = [h for h in ("b", "c") if os.path.isfile(f"{disk(h)}/csv/lightning_logs/version_1/metrics.csv")]
    assert len(wrote) == 1, "rank 0's host alone holds the run's logs"
    assert glob.glob(f"{disk(wrote[0])}/tb/lightning_logs/version_1/events.out.tfevents.*")
    for host in ("b", "c"):
        for kind in ("csv", "tb"):
            assert sorted(os.listdir(f"{disk(host)}/{kind}/lightning_logs/version_0")) == ["earlier"], (host, kind)
    assert not os.path.exists(f"/proc/{made.hosts['a'].holder.pid}/root{RUN}/lt/csv"), "nothing on the driver's disk"

"""`raylight run` of a Horovod script (the raylight.horovod compat layer) across hosts (issue
57): the head on a (no CPU), one raylet on each of b and c. The script is on the shared
directory and run from a, from a working directory on a's own disk (each rank says it runs
elsewhere); then it is only on the laptop d, which sends it with `raylight submit
--working-dir`."""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest
import torch
from torch import nn

from tests.hosts.harness import RUN, SHARED
from tests.hosts.ray_cluster import DASHBOARD_PORT, RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]  # 32 s quiet, 2-3 min at load 30
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "horovod_script.py")
RAYLIGHT = os.path.join(os.path.dirname(sys.executable), "raylight")


def _one_process() -> dict[str, torch.Tensor]:
    """Both ranks' batches in one process: the average of the two gradients."""
    sys.path.insert(0, HERE)
    import horovod_script

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    horovod_script.train(model, torch.optim.SGD(model.parameters(), lr=0.05), [0, 1])
    return model.state_dict()


def _check(output: str, params: str) -> None:
    hosts = dict(re.findall(r"^\[rank \d\] HOST (\d) (\w+)$", output, re.M))
    assert sorted(hosts) == ["0", "1"] and sorted(hosts.values()) == ["b", "c"], output
    got, want = torch.load(params, weights_only=True), _one_process()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], atol=1e-6, rtol=0), key


def test_a_horovod_script_on_the_shared_directory_or_sent_from_a_laptop_runs_one_rank_per_host(make_hosts):
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    shutil.copy(SCRIPT, os.path.join(made.shared, "hvd.py"))
    run = [RAYLIGHT, "run", "-n", "2", "--storage-path", f"{SHARED}/runs", "-m", "raylight.horovod"]
    os.makedirs(f"/proc/{made.hosts['a'].holder.pid}/root{RUN}/here")  # the driver's cwd, on a's disk only
    done = made.run("a", ["sh", "-c", f'cd {RUN}/here && exec env RAY_ADDRESS={cluster.address} "$@"', "sh", *run,
                          f"{SHARED}/hvd.py", f"{SHARED}/shared.pt"], timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    _check(done.stdout, os.path.join(made.shared, "shared.pt"))
    said = " ".join(done.stderr.split())  # each rank says it does not run in the driver's cwd
    warned = re.findall(rf"\[rank (\d)\] raylight run: the driver's working directory {RUN}/here is not on this node \((\w)\)", said)
    assert sorted(warned) in (
        [("0", "b"), ("1", "c")], [("0", "c"), ("1", "b")]
    ), done.stderr

    cluster.give_token("d")
    job = f"/proc/{made.hosts['d'].holder.pid}/root{RUN}/job"  # d's own disk only
    os.makedirs(job)
    shutil.copy(SCRIPT, os.path.join(job, "hvd.py"))
    url = f"http://{made.address('a')}:{DASHBOARD_PORT}"
    done = made.run("d", [RAYLIGHT, "submit", "--address", url, "--working-dir", f"{RUN}/job", "--name", "hvd", "--",
                          "raylight", *run[1:], "hvd.py", f"{SHARED}/sent.pt"], timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCEEDED" in done.stderr, done.stderr
    _check(done.stdout, os.path.join(made.shared, "sent.pt"))

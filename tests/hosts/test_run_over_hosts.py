"""`raylight run` of a torchrun-style script across hosts (issue 57): the head on a (no CPU),
one raylet on each of b and c, the driver on a. The script is the launch tests' example
(examples/launch/ddp_torchrun.py) with one line in front that prints the rank's hostname."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from tests.hosts.harness import RUN, SHARED, Hosts
from tests.hosts.ray_cluster import RayOverHosts, cluster_env

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]  # 28 s quiet, 2-3 min at load 30
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "launch", "ddp_torchrun.py")
HOSTNAME = 'import os, socket; print("HOST", os.environ["RANK"], socket.gethostname(), flush=True)\n'
STEPS = "12"


def place_script(made: Hosts, host: str | None, directory: str) -> str:
    """The example, with the hostname line, at ``directory`` (the shared directory when
    ``host`` is None, else in ``host``'s private /tmp); its path inside the hosts."""
    with open(EXAMPLE) as f:
        text = HOSTNAME + f.read()
    root = made.shared if host is None else f"/proc/{made.hosts[host].holder.pid}/root{directory}"
    if host is None:
        assert directory == SHARED
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "ddp_torchrun.py"), "w") as f:
        f.write(text)
    return f"{directory}/ddp_torchrun.py"


def one_host_params(made: Hosts, script: str) -> dict[str, torch.Tensor]:
    """The script's parameters under plain torchrun, 2 processes on host a."""
    out = f"{SHARED}/one-host.pt"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", "29511"]
    made.run("a", [*torchrun, script, "--steps", STEPS, "--out", out], timeout=180)
    return torch.load(os.path.join(made.shared, "one-host.pt"), weights_only=True)


def _raylight_run(made: Hosts, cluster: RayOverHosts, host: str, *args: str, timeout: float = 240):
    cmd = ["env", f"RAY_ADDRESS={cluster.address}", os.path.join(os.path.dirname(sys.executable), "raylight"),
           "run", *args]
    return made.run(host, cmd, timeout=timeout, check=False)


def test_a_script_on_the_shared_directory_runs_one_rank_per_host_as_on_one_host(make_hosts):
    """-n 2 with one CPU on each of b and c: rank 0 and rank 1 on different hosts, and the
    parameters torchrun gives with both processes on one host. Then the script only on a's own
    disk: the run fails naming a node that lacks it and how to send it."""
    made = make_hosts(["a", "b", "c"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    script = place_script(made, None, SHARED)
    done = _raylight_run(made, cluster, "a", "-n", "2", "--storage-path", f"{SHARED}/runs", script,
                         "--steps", STEPS, "--out", f"{SHARED}/two-hosts.pt")
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = dict(re.findall(r"^\[rank \d\] HOST (\d) (\w+)$", done.stdout, re.M))
    assert sorted(hosts) == ["0", "1"] and sorted(hosts.values()) == ["b", "c"], done.stdout
    got = torch.load(os.path.join(made.shared, "two-hosts.pt"), weights_only=True)
    want = one_host_params(made, script)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key

    local = place_script(made, "a", RUN)  # a's /tmp is its own: b and c do not have it
    done = _raylight_run(made, cluster, "a", "-n", "2", "--storage-path", f"{SHARED}/runs", local,
                         "--steps", STEPS)
    assert done.returncode == 2, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert re.search(rf"script {local} is not on this node \([bc]\)", err), err
    assert "raylight submit --working-dir DIR -- raylight run" in err, err

"""`raylight submit` and `raylight jobs` from a laptop (issue 57): host d runs only the CLI (no
raylet, no Ray node), with the cluster's token in its home; the head on a (no CPU) serves the
Jobs API on its own address, one raylet on each of b and c. The script lives only on d: the job
sends it (``--working-dir``) and ``raylight run`` in the job starts it on b and c."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from tests.helpers import wait_until
from tests.hosts.harness import RUN, SHARED
from tests.hosts.ray_cluster import DASHBOARD_PORT, RayOverHosts, cluster_env
from tests.hosts.test_run_over_hosts import STEPS, one_host_params, place_script

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(420)]  # 45 s quiet, 2-4 min at load 30
RAYLIGHT = os.path.join(os.path.dirname(sys.executable), "raylight")


def _rank_hosts(logs: str) -> list[str]:
    """The hosts the ranks' HOST lines name in a job's logs, sorted."""
    return sorted(re.findall(r"^\[rank \d\] HOST \d (\w+)$", logs, re.M))


def test_submit_from_a_laptop_runs_the_sent_script_on_two_hosts_then_list_logs_and_stop_work_from_there(make_hosts):
    made = make_hosts(["a", "b", "c", "d"], env=cluster_env())
    cluster = RayOverHosts(made, head="a", raylets={"b": 1, "c": 1})
    cluster.give_token("d")  # the laptop: the token, as an admin hands it out
    url = f"http://{made.address('a')}:{DASHBOARD_PORT}"
    script = place_script(made, "d", f"{RUN}/job")  # on d's own disk only

    def cli(*args: str, timeout: float = 60):
        return made.run("d", [RAYLIGHT, *args, "--address", url], timeout=timeout, check=False)

    done = made.run("d", [RAYLIGHT, "submit", "--address", url, "--working-dir", f"{RUN}/job", "--name", "laptop",
                          "--", "raylight", "run", "-n", "2", "--storage-path", f"{SHARED}/runs",
                          os.path.basename(script), "--steps", STEPS, "--out", f"{SHARED}/job.pt"],
                    timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = dict(re.findall(r"^\[rank \d\] HOST (\d) (\w+)$", done.stdout, re.M))  # the streamed logs
    assert sorted(hosts) == ["0", "1"] and sorted(hosts.values()) == ["b", "c"], done.stdout
    assert "submitted laptop" in done.stderr and "SUCCEEDED" in done.stderr, done.stderr
    got = torch.load(os.path.join(made.shared, "job.pt"), weights_only=True)
    want = one_host_params(made, place_script(made, None, SHARED))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    listed = cli("jobs", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:4] == ["laptop", "laptop", "0", "SUCCEEDED"] for line in listed.stdout.splitlines()), listed.stdout
    logs = cli("jobs", "logs", "laptop")
    assert logs.returncode == 0, logs.stderr
    assert _rank_hosts(logs.stdout) == ["b", "c"], logs.stdout

    # a run that trains until stopped: `jobs stop` from the laptop ends it on b and c
    started = made.run("d", [RAYLIGHT, "submit", "--address", url, "--working-dir", f"{RUN}/job", "--name", "endless",
                             "--no-wait", "--", "raylight", "run", "-n", "2", "--storage-path", f"{SHARED}/runs",
                             os.path.basename(script), "--steps", str(10**9)], timeout=120, check=False)
    assert started.returncode == 0, started.stdout + started.stderr

    wait_until(lambda: _rank_hosts(cli("jobs", "logs", "endless").stdout) == ["b", "c"], 240, "the endless job's ranks on b and c")
    stopped = cli("jobs", "stop", "endless")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr

    def status(name: str) -> list[str]:
        rows = cli("jobs", "list").stdout.splitlines()
        return [line.split()[3] for line in rows if line.split()[:2] == [name, name]]

    wait_until(lambda: status("endless") == ["STOPPED"], 120, "the endless job STOPPED")
    assert status("laptop") == ["SUCCEEDED"]

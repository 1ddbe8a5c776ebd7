"""Two runs share a fake 2-node cluster through the raylight scheduler: both finish, and
each run's size follows its allocation (tests/support/two_jobs_driver.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.scheduler.test_scheduler_cli_on_ray import child_env

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

SCHEDULED = "the raylight scheduler's allocation"


def test_two_adaptive_runs_share_a_cluster_and_follow_their_allocations(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.two_jobs_driver", str(tmp_path)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    assert data["errors"] == {}, data["errors"]  # both finished
    allocations = {k: [r for r in rows if r.get("event") == "allocation"] for k, rows in data["trace"].items()}
    # B, a fixed run of 2, got its size; A (1 to 4) never more than the 2 B left it
    assert {r["workers"] for r in allocations["b"]} == {2} and {r["waiting"] for r in allocations["b"]} == {""}
    assert all(1 <= r["workers"] <= 2 for r in allocations["a"]), allocations["a"]
    # A resized only to what the scheduler gave it, and ran its allocation's size
    [resized] = [r for r in data["trace"]["a"] if r.get("event") == "resized"]
    assert resized["reason"].startswith(SCHEDULED) and resized["to"] == allocations["a"][-1]["workers"] == 2, resized
    both = {j["job_id"]: j for j in data["both"]["jobs"]}
    assert both.keys() == {"a", "b"} and sum(j["workers"] for j in both.values()) <= sum(data["both"]["nodes"].values()) == 4
    assert both["a"]["goodput"] is not None and both["b"]["goodput"] is None  # A's fitted model; B is fixed
    assert data["end"]["jobs"] == [] and data["end"]["dropped"] == []  # both unregistered at their end

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
    """Both finish; neither resizes but to its allocation; the two never hold more than
    the cluster's slots; both unregister."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.two_jobs_driver", str(tmp_path)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    assert data["errors"] == {}, data["errors"]  # both finished
    trace = data["trace"]
    allocations = {k: [r for r in rows if r.get("event") == "allocation"] for k, rows in trace.items()}
    # a run is told 0 (and why) only while another still holds the slots it is to get
    assert all((1 <= r["workers"] <= 4 and r["waiting"] == "") or (r["workers"] == 0 and "held by runs" in r["waiting"])
               for rows in allocations.values() for r in rows), allocations
    # every resize of either run went to an allocation the scheduler gave it before (or
    # to fewer, what fit then), never to a size of the run's own choosing
    resizes = {k: [r for r in rows if r.get("event") == "resized"] for k, rows in trace.items()}
    assert resizes["a"], "A took the allocation its fitted model won it"
    for run, done in resizes.items():
        for r in done:
            given = {a["workers"] for a in allocations[run] if a["time"] <= r["time"]}
            assert r["reason"].startswith(SCHEDULED) and (r["to"] in given or r["reason"].endswith("fit now")), (r, given)
    both = {j["job_id"]: j for j in data["both"]["jobs"]}
    assert both.keys() == {"a", "b"} and sum(j["workers"] for j in both.values()) <= sum(data["both"]["nodes"].values()) == 4
    assert data["end"]["jobs"] == [] and data["end"]["dropped"] == []  # both unregistered at their end

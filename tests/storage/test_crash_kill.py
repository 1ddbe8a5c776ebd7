"""SIGKILL the driver's writer during commits and deletes, then resume.

The schedule is seeded: ``tests/kill_writer.py`` picks, for each of 30 cycles, the
file operation (of the recorder's renames, fsyncs, creations and removals) at which the
writer kills itself. After each kill the run is opened as a resuming driver opens it.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

SEED, CYCLES = 20261123, 30


@pytest.mark.timeout(240)
def test_sigkill_at_30_points_of_commits_and_deletes_loses_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tests.kill_writer", str(tmp_path / "run"), str(SEED), str(CYCLES)],
        cwd=REPO, capture_output=True, text=True, timeout=200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == CYCLES
    for row in rows:
        assert row["killed"], row
        assert row["unloadable"] == [] and row["damaged"] == [], row  # every checkpoint loads
        assert row["leftovers"] == [], row  # the next open removed the debris
        assert row["contiguous"], row  # history = the reports up to the resumed checkpoint
    where = collections.Counter(row["where"] for row in rows)
    assert where["commit_checkpoint"] >= 5 and where["delete_checkpoint"] >= 5, where
    assert sum(1 for row in rows if row["debris"]) >= 10  # kills landed mid-operation
    progress = [row["resumed_at_report"] for row in rows]
    assert progress == sorted(progress) and progress[-1] > 40  # resumed runs went on

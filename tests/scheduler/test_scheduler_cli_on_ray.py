"""`raylight scheduler start|status|stop` as a user runs them, on a cluster of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(180)]  # 36 s here, 2 busy cores: five Python starts


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, "RAY_AUTH_MODE": "token", **extra}


@contextmanager
def own_cluster(*cpus: int) -> Iterator[str]:
    """The GCS address of a fake cluster of nodes with ``cpus`` CPUs each (tests/support/own_cluster.py)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.own_cluster", *map(str, cpus)], cwd=REPO, env=child_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()  # '' when it died: its stderr says why
        assert line.startswith("ADDRESS "), (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line.split()[1]
    finally:
        proc.stdin.close()  # it shuts its nodes down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def raylight(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raylight.cli", *args], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout,
    )


def test_start_status_stop_on_a_cluster_of_its_own():
    with own_cluster(2) as address:
        started = raylight("scheduler", "start", "--address", address)
        assert started.returncode == 0 and "started the raylight scheduler" in started.stderr, started.stderr
        shown = raylight("scheduler", "status", "--address", address)
        assert shown.returncode == 0, shown.stderr
        assert "raylight scheduler" in shown.stdout and "(no runs)" in shown.stdout
        assert "1 node(s), 2 slot(s)" in " ".join(shown.stdout.split())  # one node of two CPUs
        stopped = raylight("scheduler", "stop", "--address", address)
        assert stopped.returncode == 0 and "stopped the raylight scheduler" in stopped.stderr, stopped.stderr
        gone = raylight("scheduler", "status", "--address", address)
        assert gone.returncode == 2 and "no raylight scheduler runs on this cluster" in gone.stderr, gone.stderr

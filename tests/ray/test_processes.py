"""Whole driver processes: killed and resumed; the examples as users run them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.conftest import REPO, _ray_processes

pytestmark = pytest.mark.timeout(240)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    return env


def _wait(cond, timeout_s, what, proc=None):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"driver exited early ({proc.returncode}) while waiting for {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def test_resume_after_the_driver_is_killed(tmp_path, ray_cluster):
    storage, log = str(tmp_path / "runs"), str(tmp_path / "starts.log")
    temp_dir = tempfile.mkdtemp(prefix="rl-drv-", dir="/tmp")
    marker = tmp_path / "runs" / "resumable" / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.ray.resume_driver", storage, temp_dir]
    first = subprocess.Popen([*cmd, "0", log], cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(marker.exists, 120, "checkpoint 2", first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    # The embedded cluster shares the driver's fate: nothing of it stays behind.
    _wait(lambda: not _ray_processes(temp_dir), 60, "the killed driver's Ray processes to exit")
    second = subprocess.run([*cmd, "1", log], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "EPOCHS [0, 1, 2, 3, 4]" in second.stdout
    with open(log) as f:
        assert f.read().split() == ["start", "0", "start", "3"]
    _wait(lambda: not _ray_processes(temp_dir), 60, "the second driver's Ray processes to exit")


def test_digits_example_runs(tmp_path, ray_cluster):
    out = subprocess.run(
        [sys.executable, "examples/digits.py", "--epochs", "4", "--quiet", "--storage", str(tmp_path)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=200,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "test accuracy" in ln)
    accuracy = float(line.rsplit("test accuracy", 1)[1].strip().rstrip("%"))
    assert accuracy > 85.0, line


def test_ctrl_c_on_the_driver_leaves_no_processes(tmp_path, ray_cluster):
    temp_dir = tempfile.mkdtemp(prefix="rl-int-", dir="/tmp")
    marker = tmp_path / "runs" / "resumable" / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.ray.resume_driver", str(tmp_path / "runs"), temp_dir, "0", str(tmp_path / "log")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(marker.exists, 120, "checkpoint 2", proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in out
    _wait(lambda: not _ray_processes(temp_dir), 60, "the interrupted driver's Ray processes to exit")

"""What a run exposes: its listeners, and what crosses from workers to the driver."""

from __future__ import annotations

import ipaddress
import os
import threading
from pathlib import Path

import pytest

import raylight
from tests.helpers import listening_sockets, process_tree, wait_until
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def test_a_single_node_run_listens_on_loopback_only(ray_cluster, tmp_path):
    """Every listening socket of the run's process tree (this driver, the embedded Ray
    and the workers), while rank 0's rendezvous store and gloo are up."""
    release = tmp_path / "release"
    config = {"dir": str(tmp_path), "release": str(release)}
    outcome: dict = {}

    def train() -> None:
        try:
            outcome["result"] = raylight.fit(
                loops.listening_loop, config=config, num_workers=2, storage_path=str(tmp_path), progress=False
            )
        except BaseException as exc:  # surfaced by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: all((tmp_path / f"pid{r}").exists() for r in (0, 1)) or "error" in outcome,
            120, "both workers to rendezvous",
        )
        assert "error" not in outcome, outcome.get("error")
        workers = {int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)}
        sockets = listening_sockets(process_tree(os.getpid()))
    finally:
        release.touch()
        thread.join(120)
    assert "error" not in outcome, outcome["error"]
    assert outcome["result"].metrics["gathered"] == 2
    by_worker = [s for s in sockets if s[0] in workers]
    # The rendezvous store (rank 0) and gloo (both ranks) listen: the listing sees them.
    assert {pid for pid, _, _ in by_worker} == workers, sockets
    exposed = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed} (all: {sockets})"


def test_the_embedded_cluster_runs_without_ray_s_api_server_and_monitor(ray_cluster):
    """Ray starts its API server (``dashboard.py``) even with the dashboard off, and its
    autoscaler monitor (``monitor.py``); the embedded cluster does without both
    (``runtime._lean_head``): no such process under this driver, no address published for
    the API server, and the cluster serves tasks. Its raylet starts Ray's minimal node
    agent (no metrics or HTTP server), though this venv has the full one (ray[default]),
    with none of its dashboard modules."""
    import ray

    cmdlines = []
    for pid in process_tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    assert any("raylet" in c for c in cmdlines), cmdlines  # the listing sees Ray's processes
    assert not [c for c in cmdlines if "dashboard/dashboard.py" in c or ("/autoscaler/" in c and "monitor.py" in c)], cmdlines
    raylets = [c for c in cmdlines if "raylet/raylet " in c]
    assert len(raylets) == 1 and "--dashboard_agent_command=" in raylets[0], raylets
    agent_command = raylets[0].split("--dashboard_agent_command=", 1)[1]
    assert " --minimal" in agent_command and "_embedded_agent.py" in agent_command, raylets
    # The agent runs through raylight's shim (runtime._lean_head): Ray's agent, no modules.
    agents = [c for c in cmdlines if "_embedded_agent.py" in c and "dashboard/agent.py" in c]
    assert len(agents) == 1, cmdlines
    node = ray._private.worker._global_node
    assert "Loaded 0 modules." in (Path(node.get_logs_dir_path()) / "dashboard_agent.log").read_text()
    assert node.webui_url is None
    assert ray.get(ray.remote(lambda: 1).remote(), timeout=60) == 1


def test_an_embedded_start_in_a_fresh_home_makes_ray_s_token_readable_by_its_owner_only(tmp_path):
    """Ray itself would write ``~/.ray/auth_token`` with the umask (0644); the embedded
    start makes it 0600 first, and Ray runs with it (token authentication on)."""
    import subprocess
    import sys

    home, temp = tmp_path / "home", Path("/tmp") / f"rl-tok-{os.getpid()}"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS")}
    code = (
        "import os, ray\n"
        "from raylight.driver import runtime\n"
        f"runtime.start_embedded(num_cpus=1, temp_dir={str(temp)!r}, object_store_memory=80 * 1024**2)\n"
        "print('mode', os.environ['RAY_AUTH_MODE'], ray.get(ray.remote(lambda: 42).remote()))\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=150,
        )
    finally:
        import shutil

        shutil.rmtree(temp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mode token 42" in out.stdout
    token = home / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and (home / ".ray").stat().st_mode & 0o777 == 0o700
    assert token.read_text() not in out.stdout + out.stderr

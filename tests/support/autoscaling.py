"""A real Ray autoscaler on this machine: Ray's fake multi-node provider starts and stops
real raylets as the autoscaler decides. Started the way ``AutoscalingCluster.start()``
does, but without its ``ray stop --force`` (which ends every Ray process on the machine):
a private head on loopback, with its own temp dir, stopped by the PIDs of that dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from tests.helpers import process_tree, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_cluster_config(
    *, head_cpus: float, worker_types: dict[str, dict[str, Any]], gcs_address: str, idle_timeout_minutes: float
) -> dict[str, Any]:
    """The autoscaler's cluster config for the fake multi-node provider."""
    types = {"ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0}}
    types.update(worker_types)
    return {
        "cluster_name": "raylight-fake",
        "max_workers": sum(t.get("max_workers", 0) for t in worker_types.values()),
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "available_node_types": types,
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def _ray_pids(temp_dir: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines() if temp_dir in line]


@contextlib.contextmanager
def autoscaling_cluster(
    *, head_cpus: float, worker_types: dict[str, dict[str, Any]], idle_timeout_minutes: float = 0.1,
    env: dict[str, str] | None = None, start_timeout_s: float = 60,
) -> Iterator[str]:
    """Start the head (and with it the autoscaler); yield its GCS address. Everything it
    started is ended by PID on exit. Its ports are free when chosen but may be taken before
    the head binds them (the suite's other Ray processes take ports all the time): a head
    that exits before it is up is started once more on new ports, and its output is in the
    error if that one exits too."""
    run_env = {**os.environ, **(env or {})}
    run_env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    run_env.pop("RAY_ADDRESS", None)
    for attempt in (1, 2):
        temp_dir = tempfile.mkdtemp(prefix="rl-as-", dir="/tmp")
        head, address = _start_head(temp_dir, head_cpus, worker_types, idle_timeout_minutes, run_env)
        try:
            up = os.path.join(temp_dir, "ray_current_cluster")
            wait_until(lambda up=up: os.path.exists(up), start_timeout_s, "the head to start", proc=head)
            break
        except AssertionError as failed:  # its message holds the head's output when it exited
            exited = head.poll() is not None
            stop(head, temp_dir)
            shutil.rmtree(temp_dir, ignore_errors=True)
            if attempt == 2 or not exited:
                raise AssertionError(f"the autoscaling head did not start: {str(failed)[-3000:]}") from None
    try:
        yield address
    finally:
        stop(head, temp_dir)
    shutil.rmtree(temp_dir)  # kept where the run failed, with Ray's and the autoscaler's logs


def _start_head(
    temp_dir: str, head_cpus: float, worker_types: dict[str, dict[str, Any]], idle_timeout_minutes: float,
    env: dict[str, str],
) -> tuple[subprocess.Popen, str]:
    """``ray start --head`` with the fake multi-node provider, on new free ports."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    config = os.path.join(temp_dir, "autoscaling.json")
    with open(config, "w") as f:
        json.dump(fake_cluster_config(head_cpus=head_cpus, worker_types=worker_types, gcs_address=address,
                                      idle_timeout_minutes=idle_timeout_minutes), f)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--autoscaling-config={config}", f"--port={port}",
         "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", f"--num-cpus={head_cpus:g}",
         "--include-dashboard=false", "--disable-usage-stats",
         f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         f"--min-worker-port={free_port()}", "--max-worker-port=0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    return head, address


def stop(head: subprocess.Popen, temp_dir: str) -> None:
    """End the head (it ends what it started) and anything left of this temp dir, by PID."""
    pids = set(process_tree(head.pid))
    for pid in _ray_pids(temp_dir):
        pids.update(process_tree(pid))
    with contextlib.suppress(ProcessLookupError):
        head.send_signal(signal.SIGTERM)
    try:
        head.wait(20)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10
    for pid in _ray_pids(temp_dir):
        pids.update(process_tree(pid))
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and not _zombie(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(5)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

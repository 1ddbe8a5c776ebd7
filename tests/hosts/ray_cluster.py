"""A Ray cluster over fake hosts (tests/hosts/harness.py): the head on one host, a raylet on
each of the others, token authentication on, the token handed to every host as an admin would
(``RAY_AUTH_MODE=token`` and the token file in each host's home). Everything lives in the
hosts' private /tmp; stopping is by the hosts' PIDs (``Hosts.kill_host``), never ``ray stop``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence

from tests.hosts.harness import HOME, Hosts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
GCS_PORT = 6379  # each host has its own network: Ray's default ports collide with nothing
DASHBOARD_PORT = 8265
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 4,
}
# Every Ray worker process (driver, actor), raylight's or not, has one listener on all
# interfaces ("::") on a port of Ray's default worker port range (seen on Ray 2.60 with a plain
# actor over these hosts; --min/max-worker-port did not move it): Ray's own, not raylight's
RAY_OWN_PORTS = range(10002, 20000)


def cluster_env() -> dict[str, str]:
    return {
        "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{REPO}/src:{REPO}",
        "RAY_AUTH_MODE": "token",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }


class RayOverHosts:
    """``RayOverHosts(hosts, head="a", raylets={"b": 1, "c": 1})``: the head holds no CPU, so
    work goes to the raylets' hosts."""

    def __init__(self, hosts: Hosts, head: str, raylets: dict[str, int], head_cpus: int = 0):
        self.hosts, self.head = hosts, head
        self.address = f"{hosts.address(head)}:{GCS_PORT}"
        token = self._token = secrets.token_hex(32)
        for name in [head, *raylets]:
            self._hand_token(name, token)
        self.procs: dict[str, subprocess.Popen] = {}
        self._start(
            head,
            [
                "--head",
                "--port",
                str(GCS_PORT),
                "--dashboard-host",
                hosts.address(head),
                "--dashboard-port",
                str(DASHBOARD_PORT),
                "--num-cpus",
                str(head_cpus),
            ],
        )
        self._wait_for("Ray runtime started", head)
        # one at a time: raylets registering at once on a loaded box timed out at the GCS
        # ("Failed to get node info: Deadline Exceeded", load average 20 on 2 cores)
        for name, cpus in raylets.items():
            self._start(name, ["--address", self.address, "--num-cpus", str(cpus)])
            self._wait_for("Ray runtime started", name)
        self.wait_nodes(1 + len(raylets))

    def give_token(self, host: str) -> None:
        """The cluster's token in ``host``'s home, for a machine that only submits (a laptop)."""
        self._hand_token(host, self._token)

    def _hand_token(self, host: str, token: str) -> None:
        # the host's home is in its private /tmp: written through its holder's root
        ray_dir = f"/proc/{self.hosts.hosts[host].holder.pid}/root{HOME}/.ray"
        os.makedirs(ray_dir, mode=0o700, exist_ok=True)
        path = os.path.join(ray_dir, "auth_token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)

    def _start(self, host: str, args: Sequence[str]) -> None:
        cmd = [
            os.path.join(VENV_BIN, "ray"),
            "start",
            "--block",
            "--node-ip-address",
            self.hosts.address(host),
            "--temp-dir",
            "/tmp/ray",
            "--object-store-memory",
            str(80 * 1024**2),
            "--disable-usage-stats",
            *args,
        ]
        log = open(self.log_path(host), "w")  # noqa: SIM115 - open while the node runs
        self.procs[host] = self.hosts.popen(host, cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def log_path(self, host: str) -> str:
        return os.path.join(self.hosts.shared, f"ray-{host}.log")

    def log(self, host: str) -> str:
        with open(self.log_path(host)) as f:
            return f.read()

    def _wait_for(self, text: str, host: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log(host):
            if self.procs[host].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"ray start on host {host} did not say {text!r}:\n{self.log(host)[-3000:]}"
                )
            time.sleep(0.2)

    def wait_nodes(self, n: int, timeout: float = 120) -> None:
        probe = (
            "import ray,sys,time; ray.init(address=sys.argv[1], log_to_driver=False)\n"
            f"end=time.monotonic()+{timeout}\n"
            f"while sum(x['Alive'] for x in ray.nodes()) < {n} and time.monotonic() < end: time.sleep(0.2)\n"
            "print(sum(x['Alive'] for x in ray.nodes()))"
        )
        done = self.hosts.run(
            self.head, [sys.executable, "-c", probe, self.address], timeout=timeout + 60
        )
        alive = int(done.stdout.split()[-1])
        if alive < n:
            raise RuntimeError(f"{alive} of {n} Ray nodes alive")

    def add_raylet(self, host: str, cpus: int) -> None:
        """A raylet on ``host`` joins (a machine added to the cluster)."""
        self._hand_token(host, self._token)
        self._start(host, ["--address", self.address, "--num-cpus", str(cpus)])
        self._wait_for("Ray runtime started", host)

    def wait_alive(self, hosts: Sequence[str], timeout: float = 120) -> None:
        """Until the nodes Ray counts alive are exactly those of ``hosts`` (a dead host's
        node is told dead by the head's health checks)."""
        want = sorted(self.hosts.address(h) for h in hosts)
        probe = (
            "import json,ray,sys,time; ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "want=json.loads(sys.argv[2]); end=time.monotonic()+float(sys.argv[3])\n"
            "alive=lambda: sorted(x['NodeManagerAddress'] for x in ray.nodes() if x['Alive'])\n"
            "while alive() != want and time.monotonic() < end: time.sleep(0.2)\n"
            "print('alive=' + json.dumps(alive()))"
        )
        args = [sys.executable, "-c", probe, self.address, json.dumps(want), str(timeout)]
        done = self.hosts.run(self.head, args, timeout=timeout + 60)
        # Ray may print its own warnings after it ("raylet has lagging heartbeats ..." under load)
        alive = json.loads([line for line in done.stdout.splitlines() if line.startswith("alive=")][-1][6:])
        if alive != want:
            raise RuntimeError(f"Ray nodes alive: {alive}, wanted {want}")

    def driver(self, script: str, *args: str, host: str | None = None, timeout: float = 300) -> str:
        """Run ``script`` (a file) with RAY_ADDRESS set to the head, on ``host`` (the head's
        by default); its stdout, or an error with its output and the nodes' logs."""
        host = host or self.head
        cmd = ["env", f"RAY_ADDRESS={self.address}", sys.executable, script, *args]
        done = self.hosts.run(host, cmd, timeout=timeout, check=False)
        if done.returncode != 0:
            logs = "\n".join(f"--- {h}\n{self.log(h)[-1500:]}" for h in self.procs)
            raise AssertionError(
                f"the driver exited {done.returncode}:\n{done.stdout}\n{done.stderr[-5000:]}\n{logs}"
            )
        return done.stdout


def start_ray(hosts: Hosts, head: str, raylets: dict[str, int], tries: int = 3, **kw) -> RayOverHosts:
    """``RayOverHosts`` that starts again (the Ray hosts' processes killed by PID first) where
    ``ray start`` timed out: on a box with ten times more runnable processes than cores, Ray's
    own fixed 30 s wait for a node to register (ray/_private/node.py) ran out before the GCS
    answered ("Failed to get node info: Deadline Exceeded"), while the same start passed when
    the load was lower. Only the start is tried again, never what a test asserts."""
    for attempt in range(tries):
        try:
            return RayOverHosts(hosts, head=head, raylets=raylets, **kw)
        except RuntimeError as exc:
            if "did not say 'Ray runtime started'" not in str(exc) or attempt == tries - 1:
                raise
            for name in [head, *raylets]:
                hosts.kill_host(name)
            # `ray start --head` refuses where this file names an address that some gcs_server
            # of the box serves (it looks at every process, other hosts' clusters included)
            current = f"/proc/{hosts.hosts[head].holder.pid}/root/tmp/ray/ray_current_cluster"
            if os.path.exists(current):
                os.remove(current)
    raise AssertionError("unreachable")

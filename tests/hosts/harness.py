"""Separate hosts on one Linux box, for the tests that need several machines (issue 57).

A host is a network namespace (its own address on 198.18.0.0/24, its own loopback) entered
together with a mount and UTS namespace held by one long-lived process per host: a private
``/tmp`` and ``/dev/shm`` (tmpfs), a home and a run directory inside that ``/tmp``, its own
hostname. The hosts meet on a bridge inside a namespace of its own; no namespace has a default
route, so nothing leaves the hosts. The shared directory (what NFS gives a cluster) is one
directory on the box, bind-mounted at ``SHARED`` in every host.

Every name starts with a per-run prefix, so parallel runs never collide. Teardown kills every
process in the hosts' namespaces (found by /proc/*/ns/net, never by name), deletes the
namespaces (their veths and bridge go with them) and the shared directory; the mounts live
only in the holders' mount namespaces and go with them. ``leftovers()`` says what is left.
Needs root, ``ip``, ``unshare`` and ``nsenter``; ``unavailable()`` says why not where not.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

SUBNET = "198.18.0"
SHARED = "/tmp/rl-shared"  # inside every host, on top of its private /tmp
HOME = "/tmp/home"
RUN = "/tmp/run"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a host's own PATH, as a login gives
_LIVE: list[Hosts] = []


def _under_tmp() -> list[str]:
    """This checkout and the Python environment, where they live under /tmp."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = {os.path.realpath(p) for p in (repo, sys.prefix)}
    return sorted(p for p in paths if p.startswith("/tmp/"))


def unavailable() -> str | None:
    """Why hosts cannot be made here (None where they can)."""
    if os.geteuid() != 0:
        return "fake hosts need root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"fake hosts need `{tool}` on PATH"
    probe = f"rlp{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Host:
    name: str  # also its hostname
    netns: str
    address: str
    holder: subprocess.Popen  # holds the host's mount and UTS namespaces

    @property
    def ns_inode(self) -> int:
        return os.stat(f"/run/netns/{self.netns}").st_ino


class Hosts:
    """``with Hosts(["a", "b"]) as hosts:`` -- hosts a (198.18.0.1), b (198.18.0.2), ..."""

    def __init__(self, names: Sequence[str], env: dict[str, str] | None = None):
        self.prefix = f"rlh{uuid.uuid4().hex[:6]}"
        self.names = list(names)
        self.env = dict(env or {})
        self.hosts: dict[str, Host] = {}
        self.bridge_ns = f"{self.prefix}br"
        self.shared = ""  # the shared directory's path on the box (SHARED inside the hosts)
        self._started: list[subprocess.Popen] = []

    def __enter__(self) -> Hosts:
        _LIVE.append(self)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        self.shared = tempfile.mkdtemp(prefix=f"{self.prefix}-shared-", dir="/var/tmp")
        _ip("netns", "add", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for i, name in enumerate(self.names, start=1):
            netns = f"{self.prefix}{i}"
            _ip("netns", "add", netns)
            _ip(
                "-n",
                self.bridge_ns,
                "link",
                "add",
                f"v{i}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                netns,
            )
            _ip("-n", self.bridge_ns, "link", "set", f"v{i}", "master", "br0", "up")
            address = f"{SUBNET}.{i}"
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            self.hosts[name] = Host(name, netns, address, self._holder(name, netns))

    def _holder(self, name: str, netns: str) -> subprocess.Popen:
        # unshare and ip netns exec exec (no fork): the Popen's pid is the holder's
        # The code a host runs (this checkout, its venv) is installed on every machine: where it
        # lives under /tmp (a checkout in /tmp), the private /tmp would hide it, so it is bound
        # aside (into the new /dev/shm) before /tmp is covered, then moved back to its path
        keep = list(enumerate(_under_tmp()))
        aside = "".join(f"mkdir -p /dev/shm/.k{i}; mount --bind {p} /dev/shm/.k{i}; " for i, p in keep)
        back = "".join(f"mkdir -p {p}; mount --move /dev/shm/.k{i} {p}; rmdir /dev/shm/.k{i}; " for i, p in keep)
        setup = (
            f"set -e; mount -t tmpfs -o mode=1777 tmpfs /dev/shm; {aside}"
            f"mount -t tmpfs -o mode=1777 tmpfs /tmp; {back}"
            f"mkdir -p {SHARED} {HOME} {RUN}; mount --bind {self.shared} {SHARED}; hostname {name}; "
            "echo ready; exec sleep infinity"
        )
        cmd = [
            "ip",
            "netns",
            "exec",
            netns,
            "unshare",
            "-m",
            "-u",
            "--propagation",
            "private",
            "sh",
            "-c",
            setup,
        ]
        holder = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._started.append(holder)
        line = holder.stdout.readline() if holder.stdout else ""
        if line.strip() != "ready":
            err = holder.stderr.read() if holder.stderr and holder.poll() is not None else ""
            raise RuntimeError(
                f"host {name}'s namespaces could not be set up: {err.strip() or line!r}"
            )
        return holder

    # -- running things on a host ---------------------------------------------------------
    def address(self, host: str) -> str:
        return self.hosts[host].address

    def _argv(self, host: str, cmd: str | Sequence[str]) -> list[str]:
        h = self.hosts[host]
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        # enter the holder's mount + UTS namespaces and the host's network; -n by the holder too.
        # `env -i`: another machine's processes inherit nothing of this test process's
        # environment (an embedded Ray earlier in the same pytest worker sets
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 there, and a raylet started with it refuses to join)
        base = {"PATH": HOST_PATH, "HOME": HOME, "TMPDIR": RUN, **self.env}
        env = ["env", "-i", *(f"{k}={v}" for k, v in base.items())]
        return ["nsenter", "-t", str(h.holder.pid), "-n", "-m", "-u", "--", *env, *argv]

    def popen(self, host: str, cmd: str | Sequence[str], **kw) -> subprocess.Popen:
        """Start ``cmd`` on ``host`` (nsenter execs: the Popen's pid is the command's)."""
        proc = subprocess.Popen(self._argv(host, cmd), **kw)
        self._started.append(proc)
        return proc

    def run(
        self, host: str, cmd: str | Sequence[str], timeout: float = 60, check: bool = True, **kw
    ) -> subprocess.CompletedProcess:
        """Run ``cmd`` on ``host`` to its end (text output captured unless told otherwise)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        done = subprocess.run(self._argv(host, cmd), timeout=timeout, **kw)
        if check and done.returncode != 0:
            raise RuntimeError(f"on host {host}: {cmd!r} exited {done.returncode}: {done.stderr}")
        return done

    # -- machines dying, partitions, listeners ---------------------------------------------
    def pids(self, host: str) -> list[int]:
        """Every process in ``host``'s network namespace, the holder left out."""
        h = self.hosts[host]
        return [p for p in _pids_in_netns(h.ns_inode) if p != h.holder.pid]

    def kill_host(self, host: str) -> list[int]:
        """The machine dies: SIGKILL every process of the host (its private /tmp stays, a disk)."""
        killed = self.pids(host)
        for pid in killed:
            _kill(pid)
        _wait_gone(killed)
        return killed

    def cut(self, host: str) -> None:
        """A partition: the host's link goes down (its processes live on, unreachable)."""
        _ip("-n", self.hosts[host].netns, "link", "set", "eth0", "down")

    def restore(self, host: str) -> None:
        _ip("-n", self.hosts[host].netns, "link", "set", "eth0", "up")

    def block(self, host: str, other: str) -> None:
        """``host`` loses its route to ``other`` alone (its connections there fail at once,
        "no route to host"); every other link stays up."""
        _ip("-n", self.hosts[host].netns, "route", "add", "unreachable", f"{self.address(other)}/32")

    def unblock(self, host: str, other: str) -> None:
        _ip("-n", self.hosts[host].netns, "route", "del", "unreachable", f"{self.address(other)}/32")

    def listening(self, host: str) -> list[tuple[str, int]]:
        """(address, port) of every TCP listener on ``host`` (its /proc/net/tcp and tcp6)."""
        return list(self._listeners(host))

    def listener_owners(self, host: str) -> dict[tuple[str, int], str]:
        """Each listener on ``host`` and the command line of the process holding it."""
        by_inode = {inode: where for where, inode in self._listeners(host).items()}
        owners = {}
        for pid in self.pids(host):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:[") and int(target[8:-1]) in by_inode:
                    owners[by_inode[int(target[8:-1])]] = f"pid {pid}: {cmdline[:200]}"
        return owners

    def _listeners(self, host: str) -> dict[tuple[str, int], int]:
        from tests.helpers import proc_listeners

        found = proc_listeners(f"/proc/{self.hosts[host].holder.pid}/net")
        return {where: inode for inode, where in found.items()}

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process of the hosts, delete the namespaces and the shared directory."""
        inodes = set()
        for ns in self._netns_names():
            try:
                inodes.add(os.stat(f"/run/netns/{ns}").st_ino)
            except FileNotFoundError:
                pass
        for _ in range(3):  # a process may fork while the first round kills
            pids = [p for ino in inodes for p in _pids_in_netns(ino)]
            pids += [p.pid for p in self._started if p.poll() is None]
            if not pids:
                break
            for pid in pids:
                _kill(pid)
            _wait_gone(pids)
        for proc in self._started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream:
                    stream.close()
        for ns in self._netns_names():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.shared:
            shutil.rmtree(self.shared, ignore_errors=True)
        if self in _LIVE:
            _LIVE.remove(self)

    def _netns_names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(1, len(self.names) + 1)] + [self.bridge_ns]

    def leftovers(self) -> list[str]:
        """What of this run is still there (empty after close)."""
        left = [f"netns {ns}" for ns in _netns_list() if ns.startswith(self.prefix)]
        left += [f"process {p.pid}" for p in self._started if p.poll() is None]
        if self.shared and os.path.exists(self.shared):
            left.append(f"shared directory {self.shared}")
        return left


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in_netns(inode: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                pids.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pids: Sequence[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


@atexit.register
def _close_all() -> None:
    for hosts in list(_LIVE):
        hosts.close()

"""The embedded cluster's reaper: its processes die with the driver that started them.

Started by ``runtime.start_embedded`` as ``python _reaper.py DRIVER_PID TOKEN SESSION_DIR``
in a session of its own (a signal to the driver's process group does not reach it). It
waits, using no CPU, for the driver to exit (a pidfd), and then SIGKILLs every process of
that cluster that is still alive and removes the cluster's session directory.

Why: the embedded GCS and raylet die with the driver (Ray starts them with a parent-death
signal), but the raylet's node agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``)
only notice their raylet is gone at their next check, and outlived a SIGKILLed driver by up
to a minute (63 s measured here), one still listening; and Ray leaves every session
directory (``<temp dir>/session_*``) behind.

Which processes: those whose environment carries ``EMBEDDED_ENV=TOKEN``. The driver sets it
only while ``ray.init`` starts the GCS and the raylet, which pass it on to everything the
raylet starts (its agents, Ray's workers, the processes those start), so TOKEN names this
one cluster's processes and nothing else on the machine: never a process found by its name.
The orderly path (``runtime._shutdown_embedded``) does the same after ``ray.shutdown()``,
then stops this reaper.

This file is a script: it imports no raylight module (``runtime`` imports it for the
shared functions).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

EMBEDDED_ENV = "RAYLIGHT_EMBEDDED_CLUSTER"
SWEEP_S = 10.0  # at most this long killing what the cluster's processes start meanwhile


def marked(token: str) -> list[int]:
    """PIDs of live processes whose environment holds ``EMBEDDED_ENV=token`` (this user's:
    another user's environment cannot be read), this process excluded."""
    needle = f"{EMBEDDED_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, a zombie, or not ours
            continue
    return found


def kill_marked(token: str, *, sweep_s: float = SWEEP_S) -> list[int]:
    """SIGKILL the cluster's processes until none is left (or ``sweep_s`` passed: they may
    start others while they are killed); the PIDs killed."""
    killed: list[int] = []
    deadline = time.monotonic() + sweep_s
    while (pids := marked(token)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return killed


def remove_session_dir(session_dir: str) -> None:
    """Remove ``session_dir`` (one cluster's, as Ray named it) and the ``session_latest``
    link beside it when that link points to it."""
    if os.path.basename(session_dir).startswith("session_") and os.path.isdir(session_dir):
        shutil.rmtree(session_dir, ignore_errors=True)
    latest = os.path.join(os.path.dirname(session_dir), "session_latest")
    try:
        if os.readlink(latest) == session_dir:
            os.unlink(latest)
    except OSError:
        pass


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time (a reused pid has another)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[2] != "Z":
            children.setdefault(st[0], []).append((int(entry), st[1]))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid != os.getpid() and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def wait_for_exit(pid: int, seen: dict[int, int], every_s: float = 1.0) -> None:
    """Return once process ``pid`` has exited; meanwhile, every ``every_s``, add its
    descendants to ``seen`` (once it is dead, its orphans no longer say whose they were)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (an old kernel): ask every every_s
        fd = -1
    try:
        poller = select.poll()
        if fd >= 0:
            poller.register(fd, select.POLLIN)
        while os.getppid() == pid:
            seen.update(descendants(pid))
            if fd >= 0 and poller.poll(int(every_s * 1000)):
                break
            if fd < 0:
                time.sleep(every_s)
    finally:
        if fd >= 0:
            os.close(fd)


def kill_seen(seen: dict[int, int]) -> None:
    """SIGKILL the processes in ``seen`` that still run with the same start time."""
    for pid, start in seen.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main() -> None:
    driver, token, session_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    seen: dict[int, int] = {}
    if os.getppid() == driver:  # else the driver died before this started
        wait_for_exit(driver, seen)
    kill_seen(seen)
    kill_marked(token)
    remove_session_dir(session_dir)


if __name__ == "__main__":
    main()

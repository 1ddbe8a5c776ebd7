"""One writer per run: a lease on the run directory, held by the driver that writes it.

``lease.json`` in the run directory names the holder (host, pid, a random id, since
when). A second driver that opens the run while it is held is refused with
``RunInUseError`` naming the holder.

- On a local (or NFS-mounted) disk the lease is an exclusive ``flock`` on that file: the
  kernel releases it the moment the holder dies, however it dies, so a killed driver's
  run can be resumed at once and a live one can never be taken over.
- On object stores (no locks there) the holder rewrites the file every quarter of
  ``RunConfig.lease_timeout_s`` (a heartbeat); a holder silent for longer is taken over,
  with a warning. A new holder writes the file and reads it back; the holder checks it
  still holds the lease at every heartbeat and before each commit, and stops with
  ``RunInUseError`` when another took it over, so two writers overlap at most until the
  next check. This is advisory: object stores offer no atomic create-if-absent here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

from raylight.base.clock import wall
from raylight.base.exceptions import RunInUseError
from raylight.storage.run_dir import RunStorage

log = logging.getLogger("raylight")

LEASE_FILE = "lease.json"


def describe(holder: dict[str, Any], now: float) -> str:
    since = holder.get("since")
    started = _dt.datetime.fromtimestamp(since).strftime("%Y-%m-%d %H:%M:%S") if isinstance(since, int | float) else "?"
    beat = holder.get("heartbeat")
    ago = f", last heartbeat {now - beat:.0f}s ago" if isinstance(beat, int | float) else ""
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} (holder {holder.get('id', '?')}, since {started}{ago})"


class RunLease:
    """The lease on one run directory. ``acquire`` before writing anything, ``check``
    before each commit, ``release`` at the end."""

    def __init__(self, storage: RunStorage, *, timeout_s: float, clock: Callable[[], float] = wall) -> None:
        self.storage = storage
        self.timeout_s = timeout_s
        self.clock = clock
        self.id = uuid.uuid4().hex[:12]
        self.held = False
        self._lost: str | None = None  # why the lease was lost to another holder
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict[str, Any]:
        now = self.clock()
        return {"id": self.id, "host": socket.gethostname(), "pid": os.getpid(), "since": now, "heartbeat": now}

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.storage.read_text(LEASE_FILE))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    # -- acquire ------------------------------------------------------------------------
    def acquire(self) -> None:
        """Hold the lease, or raise RunInUseError naming the live holder."""
        if self.held:
            return
        self.storage.makedirs()
        if self.storage.is_local:
            self._acquire_flock()
        else:
            self._acquire_object()
        self.held = True

    def _acquire_flock(self) -> None:
        path = f"{self.storage.root}/{LEASE_FILE}"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = self._read() or {}
                raise RunInUseError(
                    f"run {self.storage.uri} is being written by another driver: "
                    f"{describe(holder, self.clock())}. Wait for it to end or stop it, or "
                    "choose another name; two drivers writing one run would overwrite each "
                    "other's checkpoints.",
                    holder=holder,
                ) from None
            try:  # the file we locked may have been removed by a holder that just released
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        data = json.dumps(self._record()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self._fd = fd

    def _acquire_object(self) -> None:
        holder = self._read()
        now = self.clock()
        if holder is not None and holder.get("id") != self.id:
            age = now - float(holder.get("heartbeat", 0.0))
            if age < self.timeout_s:
                raise RunInUseError(
                    f"run {self.storage.uri} is being written by another driver: "
                    f"{describe(holder, now)}. Wait for it to end or stop it, or choose another "
                    f"name. A holder silent for RunConfig.lease_timeout_s={self.timeout_s:g}s is "
                    "taken over.",
                    holder=holder,
                )
            log.warning(
                "taking over run %s from %s: silent for %.0fs (RunConfig.lease_timeout_s=%gs)",
                self.storage.uri, describe(holder, now), age, self.timeout_s,
            )
        self.storage.write_text(LEASE_FILE, json.dumps(self._record()))
        back = self._read()
        if back is None or back.get("id") != self.id:
            raise RunInUseError(
                f"run {self.storage.uri} was taken by another driver at the same moment: "
                f"{describe(back or {}, self.clock())}",
                holder=back or {},
            )
        self._thread = threading.Thread(target=self._heartbeat, name="raylight-lease", daemon=True)
        self._thread.start()

    # -- hold ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        interval = max(self.timeout_s / 4, 0.05)
        while not self._stop.wait(interval):
            with contextlib.suppress(RunInUseError):
                self.refresh()

    def refresh(self) -> None:
        """Object stores: renew the heartbeat, after checking no one took the lease."""
        if self.storage.is_local or not self.held or self._stop.is_set():
            return
        self.check(reread=True)
        record = self._read() or self._record()
        record["heartbeat"] = self.clock()
        self.storage.write_text(LEASE_FILE, json.dumps(record))

    def check(self, *, reread: bool = False) -> None:
        """Raise RunInUseError if another driver took the lease over (object stores)."""
        if self._lost is None and reread and not self.storage.is_local and self.held:
            holder = self._read()
            if holder is None or holder.get("id") != self.id:
                self._lost = describe(holder or {}, self.clock())
        if self._lost is not None:
            raise RunInUseError(
                f"this driver lost run {self.storage.uri} to another driver ({self._lost}) after "
                f"its lease went without a heartbeat for RunConfig.lease_timeout_s={self.timeout_s:g}s; "
                "it stops writing so as not to overwrite the other's checkpoints"
            )

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def release(self) -> None:
        """Give the lease up (the file is removed); idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if not self.held:
            return
        self.held = False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(f"{self.storage.root}/{LEASE_FILE}")
            os.close(self._fd)  # closing drops the lock
            self._fd = None
        elif self._lost is None:
            holder = self._read()
            if holder is not None and holder.get("id") == self.id:
                with contextlib.suppress(FileNotFoundError):
                    self.storage.remove(LEASE_FILE)

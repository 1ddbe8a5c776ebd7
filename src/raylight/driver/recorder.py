"""RunRecorder: the driver's record of a run, kept in its run directory.

It owns the run directory's files: the resolved config, ``status.json``,
``metrics.jsonl`` (rank 0's reports, in order; the experiment loggers get each too,
``loggers.py``), ``cost.json`` (what the run used, written
at its end) and the committed checkpoints (the
newest ``checkpoints_to_keep``), and it is the run's one writer (``RunLease``).

- ``open`` checks what can be checked and writes nothing to a new run: the directory
  appears at ``begin``, when training starts. A directory left by an attempt that never
  committed a checkpoint and did not finish is replaced by the next attempt of the same
  name; one with a checkpoint or a finished run needs ``resume=True``.
- On resume it takes the lease, removes crash debris, skips (with a warning) a newest
  checkpoint that does not load, and reloads the history up to the checkpoint it
  resumes from, dropping a torn last line, so the metrics of steps that will run again
  are not recorded twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from raylight.base.clock import wall
from raylight.base.exceptions import ConfigError
from raylight.config.schema import LEASE_TIMEOUT_S
from raylight.driver.loggers import RunLoggers
from raylight.storage.checkpoint import Checkpoint, deserialize_state
from raylight.storage.lease import LEASE_FILE, RunLease
from raylight.storage.run_dir import (
    CHECKPOINTS,
    STATE_FILE,
    CommittedCheckpoint,
    RunStorage,
    check_state,
)
from raylight.worker.protocol import CheckpointTarget, Report

log = logging.getLogger("raylight")

CONFIG_FILE = "config.json"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
TRACE_FILE = "adaptive.jsonl"
ENGINE_FILE = "adaptive_state.json"
COST_FILE = "cost.json"


class RunRecorder:
    def __init__(
        self,
        storage: RunStorage,
        *,
        checkpoints_to_keep: int,
        on_record: Callable[[dict[str, Any], Checkpoint | None], None] | None = None,
        lease_timeout_s: float = LEASE_TIMEOUT_S,
        loggers: RunLoggers | None = None,
    ) -> None:
        self.storage = storage
        self.loggers = loggers  # experiment loggers: opened at begin, fed each report
        self.on_record = on_record
        self.keep = checkpoints_to_keep
        self.history: list[dict[str, Any]] = []
        self.latest: Checkpoint | None = None
        self._lines: list[str] = []
        self._next_ckpt = 0
        self._kept: list[int] = []
        self.trace_rows: list[dict[str, Any]] = []
        self.lease = RunLease(storage, timeout_s=lease_timeout_s)
        self._config: dict[str, Any] | None = None
        self._begun = False
        self._replace = False  # the directory holds a failed attempt to clear at begin
        self._leftovers: list[str] = []  # ... its files, as open found them
        self._rewrite_metrics = False  # the file on disk differs from _lines (torn line)

    @property
    def path(self) -> str:
        return self.storage.uri

    # -- opening --------------------------------------------------------------------
    def open(
        self, config: dict[str, Any], *, resume: bool, start_from: Checkpoint | None = None
    ) -> Checkpoint | None:
        """Check the run directory (and, with ``resume``, take it over). Returns the
        checkpoint to start from: the last committed one, or ``start_from`` for a new
        run. Nothing is written to a new run until ``begin``."""
        self._config = config
        self._check_writable()
        state = self._existing()
        if not resume:
            if state == "kept":
                raise ConfigError(
                    f"run directory {self.storage.uri} already exists; pass resume=True "
                    "(RunConfig.resume) to continue it, or choose another name"
                )
            self._replace = state == "replaceable"
            if self._replace:  # what begin removes: never what this attempt's workers write
                self._leftovers = [n for n in self.storage.entries() if n not in (LEASE_FILE, CHECKPOINTS)]
                self._leftovers += [f"{CHECKPOINTS}/{n}" for n in self.storage.entries(CHECKPOINTS)]
            if start_from is not None:  # a checkpoint from elsewhere precedes every report
                self.latest = Checkpoint(
                    start_from.path, metadata={**start_from.metadata, "report": -1}, data=start_from.to_bytes()
                )
                # read here, before anything is written: a file that is no raylight
                # checkpoint (not a dict, code in its pickle) is refused naming it
                where = f"checkpoint file {start_from.path}/{STATE_FILE}" if start_from.path else "an in-memory checkpoint"
                deserialize_state(self.latest.to_bytes(), f"resume_from's {where}")
            return self.latest
        if state == "absent":
            log.warning("resume=True but %s holds no run yet; starting from scratch", self.storage.uri)
            return None
        self.lease.acquire()
        try:
            self._reopen()
        except BaseException:
            self.lease.release()
            raise
        return self.latest

    def _existing(self) -> str:
        return directory_state(self.storage)

    def _check_writable(self) -> None:
        """On a local disk: the run directory can be created where it is asked for."""
        if not self.storage.is_local:
            return
        import os

        path = self.storage.root
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError(f"run directory {path!r} is a file; choose another RunConfig.name or storage_path")
        parent = os.path.dirname(path)
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.path.isdir(parent):
            raise ConfigError(
                f"cannot create run directory {path!r}: {parent!r} is a file, not a directory; "
                "fix RunConfig.storage_path"
            )
        if parent and not os.access(parent, os.W_OK):
            raise ConfigError(f"cannot create run directory {path!r}: {parent!r} is not writable; fix RunConfig.storage_path")
        if parent and not os.path.isdir(path):
            import tempfile

            # os.access says yes where the kernel still refuses (/proc, /sys, a read-only
            # mount as root): ask the directory itself, leaving nothing behind.
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".raylight-probe-", dir=parent))
            except OSError as exc:
                raise ConfigError(
                    f"cannot create run directory {path!r}: {parent!r} does not take new directories "
                    f"({exc.strerror}); fix RunConfig.storage_path"
                ) from None

    def _reopen(self) -> None:
        """Resume: clean debris, find the newest checkpoint that loads, reload history."""
        scan = self.storage.scan_checkpoints()
        removed = self.storage.clean_debris(scan)
        if removed:
            log.warning("removed what an interrupted write or delete left in %s: %s", self.storage.uri, removed)
        for index, why in scan.unreadable:
            aside = self.storage.set_aside(index)
            log.warning("checkpoint %s of %s is damaged (%s); moved to %s", index, self.storage.uri, why, aside)
        newest = None
        committed = list(scan.committed)
        while committed:
            candidate = committed.pop()
            data, problem = self._load_checked(candidate)
            if problem is None:
                newest = candidate
                self.latest = Checkpoint(candidate.path, metadata=candidate.meta, data=data)
                break
            aside = self.storage.set_aside(candidate.index)
            fallback = f"checkpoint {committed[-1].index}" if committed else "the beginning (no other checkpoint)"
            log.warning(
                "checkpoint %s of %s does not load (%s); resuming from %s instead. It was moved to %s.",
                candidate.index, self.storage.uri, problem, fallback, aside,
            )
        indices = [c.index for c in scan.committed] + [i for i, _ in scan.unreadable]
        self._next_ckpt = max(indices, default=-1) + 1
        self._kept = [c.index for c in committed] + ([newest.index] if newest is not None else [])
        last_report = int(newest.meta.get("report", -1)) if newest is not None else -1
        self._load_history()
        if len(self.history) < last_report + 1:
            log.warning(
                "%s of %s has %d reports but checkpoint %s was made at report %d; the missing "
                "reports are lost", METRICS_FILE, self.storage.uri, len(self.history),
                newest.index if newest else "-", last_report,
            )
        self._truncate(last_report + 1)

    def _load_checked(self, ckpt: CommittedCheckpoint) -> tuple[bytes | None, str | None]:
        """The checkpoint's state bytes, or why they are not the ones it committed."""
        try:
            data = self.storage.read_state(ckpt.index)
        except (FileNotFoundError, OSError) as exc:
            return None, f"cannot read its state: {exc}"
        why = check_state(data, ckpt.meta) or self.storage.check_shards(ckpt.index, ckpt.meta)
        if why is None and "state_sha256" not in ckpt.meta:  # written before digests
            try:
                deserialize_state(data, f"checkpoint {ckpt.index}'s state.pt")
            except Exception as exc:
                why = f"its state does not deserialize: {type(exc).__name__}: {exc}"
        return data, why

    def _load_history(self) -> None:
        if not self.storage.exists(METRICS_FILE):
            return
        raw = self.storage.read_bytes(METRICS_FILE).decode(errors="replace")
        lines = raw.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        else:
            self._rewrite_metrics = bool(lines)  # no final newline: the last write was cut
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not an object")
            except ValueError:
                last = number == len(lines)
                log.warning(
                    "%s of %s: line %d is %s; dropped it", METRICS_FILE, self.storage.uri, number,
                    "torn (the driver stopped mid-write)" if last else "damaged",
                )
                self._rewrite_metrics = True
                continue
            self._lines.append(line)
            self.history.append({k: v for k, v in row.items() if not k.startswith("_")})

    # -- the directory appears when training starts ----------------------------------------
    def begin(self) -> None:
        """Training starts: create the run directory (taking its lease), or clear the
        failed attempt it holds, and write the config. Idempotent."""
        if self._begun:
            return
        self.lease.acquire()
        if self._replace:
            state = self._existing()
            if state == "kept":  # someone finished or checkpointed it meanwhile
                self.lease.release()
                raise ConfigError(
                    f"run directory {self.storage.uri} already exists; pass resume=True "
                    "(RunConfig.resume) to continue it, or choose another name"
                )
            log.warning(
                "replacing %s: its last attempt failed before committing a checkpoint (%s)",
                self.storage.uri, ", ".join(self._leftovers),
            )
            for name in self._leftovers:
                self.storage.remove(name)
        self._begun = True
        self._write_config()
        self._set_status("running")
        if self.loggers is not None:
            self.loggers.open(self._config or {}, first_step=len(self.history))

    def _write_config(self) -> None:
        if self._config is not None:
            self.storage.write_text(CONFIG_FILE, json.dumps(self._config, indent=2, default=str))

    def _set_status(self, state: str, error: BaseException | None = None) -> None:
        status: dict[str, Any] = {"state": state, "time": wall(), "checkpoint": self._kept[-1] if self._kept else None}
        if error is not None:
            status["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self.storage.write_text(STATUS_FILE, json.dumps(status))

    def close(self, error: BaseException | None = None) -> None:
        """The run ended (``error``: how it failed). Records the outcome in
        ``status.json`` and gives the lease up. Writes nothing to a run whose lease
        another driver took, or that never began."""
        try:
            if self.loggers is not None:
                self.loggers.close(failed=error is not None)
            if self._begun and self.lease.held and not self.lease.lost:
                self._set_status("failed" if error is not None else "finished", error)
        finally:
            self.lease.release()

    def checkpoint_target(self, *, clear: bool = True) -> CheckpointTarget:
        """Where workers write sharded checkpoints, and the index of the next one. With
        ``clear`` (only while no worker runs), directories from that index on that were
        never committed (shards of an attempt that failed) are removed first; a new run's
        leftovers go at ``begin``, under the lease."""
        if clear and (self._begun or self.lease.held):
            removed = self.storage.clear_uncommitted(self._next_ckpt)
            if removed:
                log.info("removed uncommitted checkpoint shards: %s", removed)
        return CheckpointTarget(self.storage.uri_of(CHECKPOINTS), self._next_ckpt)

    # -- recording ------------------------------------------------------------------
    def rollback(self) -> None:
        """Forget reports after the last committed checkpoint: a restart from it will
        report those steps again."""
        last = int(self.latest.metadata.get("report", -1)) if self.latest is not None else -1
        self._truncate(last + 1)

    def _truncate(self, num_reports: int) -> None:
        if num_reports >= len(self.history) and not self._rewrite_metrics:
            return
        del self.history[num_reports:]
        del self._lines[num_reports:]
        self.storage.write_text(METRICS_FILE, "".join(f"{ln}\n" for ln in self._lines))
        self._rewrite_metrics = False

    def record(self, report: Report, *, num_workers: int, commit_index: int | None = None) -> None:
        """Record rank 0's ``report``; commit its checkpoint, as ``commit_index`` if given
        (when checkpoints between were lost with the worker that made them)."""
        self.begin()
        self.lease.check(reread=report.checkpoint is not None)
        if report.snapshot:  # a preemption's checkpoint: committed after the last row
            if report.checkpoint is not None:
                if commit_index is not None:
                    self._next_ckpt = max(self._next_ckpt, commit_index)
                self._commit(report, len(self.history) - 1)
            return
        index = len(self.history)
        self.history.append(report.metrics)
        row = {"_report": index, "_time": report.time, "_workers": num_workers, **report.metrics}
        line = json.dumps(row, default=str)
        self._lines.append(line)
        if self.storage.is_local:
            # Durable before the checkpoint that follows it: a resume never finds a
            # checkpoint newer than the history it truncates to.
            self.storage.append_line(METRICS_FILE, line, durable=report.checkpoint is not None)
        else:  # object stores cannot append; rewrite the (small) file
            self.storage.write_text(METRICS_FILE, "".join(f"{ln}\n" for ln in self._lines))
        if report.checkpoint is not None:
            if commit_index is not None:
                if commit_index < self._next_ckpt:
                    raise ValueError(f"checkpoint {commit_index} is older than the last committed one")
                self._next_ckpt = commit_index
            self._commit(report, index)
        if self.loggers is not None:
            self.loggers.log(report.metrics, index)
        if self.on_record is not None:
            self.on_record(report.metrics, self.latest if report.checkpoint is not None else None)

    def trace(self, row: dict[str, Any], engine_state: dict[str, Any] | None = None) -> None:
        """Append one row to adaptive.jsonl (and keep the engine's state beside it)."""
        self.begin()
        self.trace_rows.append(row)
        line = json.dumps(row, default=str)
        if self.storage.is_local:
            self.storage.append_line(TRACE_FILE, line, durable=False)
        else:
            self.storage.write_text(TRACE_FILE, "".join(json.dumps(r, default=str) + "\n" for r in self.trace_rows))
        if engine_state is not None:
            self.storage.write_text(ENGINE_FILE, json.dumps(engine_state))

    def write_cost(self, cost: dict[str, Any], *, trace: bool) -> None:
        """Write ``cost.json`` (atomically) and, with ``trace`` (a run that keeps
        adaptive.jsonl), a ``cost`` row there. Nothing for a run that never began or lost
        its lease."""
        if not self._begun or not self.lease.held or self.lease.lost:
            return
        self.storage.write_text(COST_FILE, json.dumps(cost, indent=2))
        if trace:
            self.trace({"time": wall(), "event": "cost", **cost})

    def previous_cost(self) -> dict[str, Any] | None:
        """A resumed run's ``cost.json`` from its earlier attempts; None if absent or damaged."""
        return self._read_json(COST_FILE, "the run's cost counts from now")

    def engine_state(self) -> dict[str, Any] | None:
        """The adaptive engine's saved state; None (with a warning) when it is damaged."""
        return self._read_json(ENGINE_FILE, "the adaptive engine starts afresh")

    def _read_json(self, name: str, otherwise: str) -> dict[str, Any] | None:
        """A JSON object the run keeps beside its checkpoints; None when absent, and (with a
        warning saying ``otherwise``) when damaged."""
        if not self.storage.exists(name):
            return None
        try:
            value = json.loads(self.storage.read_text(name))
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("%s of %s is damaged (%s); %s", name, self.storage.uri, exc, otherwise)
            return None
        return value if isinstance(value, dict) else None

    def _commit(self, report: Report, report_index: int) -> None:
        index = self._next_ckpt
        meta = {"index": index, "report": report_index, "time": report.time, "metrics": report.metrics}
        if report.sharded_index is not None:
            if report.sharded_index != index:  # the workers number checkpoints from next_checkpoint
                raise RuntimeError(
                    f"the workers wrote sharded checkpoint {report.sharded_index} but the run's "
                    f"next checkpoint is {index}"
                )
            path, meta = self.storage.commit_sharded(index, report.checkpoint or b"", meta)
        else:
            path = self.storage.commit_checkpoint(index, report.checkpoint or b"", meta)
        self.latest = Checkpoint(path, metadata=meta, data=report.checkpoint)
        self._next_ckpt += 1
        self._kept.append(index)
        while len(self._kept) > self.keep:
            self.storage.delete_checkpoint(self._kept.pop(0))


def directory_state(storage: RunStorage) -> str:
    """absent | replaceable (a run directory whose attempt never committed a checkpoint
    and did not finish: the next attempt of that name replaces it, once it holds the
    lease) | kept (anything else: a run to resume, a finished run, other files)."""
    names = [n for n in storage.entries() if n != LEASE_FILE]
    if not names:
        return "absent"
    if storage.list_checkpoints():
        return "kept"
    try:
        status = json.loads(storage.read_text(STATUS_FILE))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        status = {}
    if isinstance(status, dict) and status.get("state") == "finished":
        return "kept"
    if not {CONFIG_FILE, METRICS_FILE, STATUS_FILE} & set(names):
        return "kept"  # not a run directory: someone else's files
    return "replaceable"

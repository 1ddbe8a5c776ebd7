"""RunRecorder: the driver's record of a run, kept in its run directory.

It owns the run directory's files: the resolved config, ``metrics.jsonl`` (rank 0's
reports, in order) and the committed checkpoints (the newest ``checkpoints_to_keep``).
On resume it reloads the history up to the last committed checkpoint, so the metrics
of steps that will run again are not recorded twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from raylight.checkpoint import Checkpoint
from raylight.exceptions import ConfigError
from raylight.storage import RunStorage
from raylight.worker_group.protocol import Report

log = logging.getLogger("raylight")

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
TRACE_FILE = "adaptive.jsonl"
ENGINE_FILE = "adaptive_state.json"


class RunRecorder:
    def __init__(
        self,
        storage: RunStorage,
        *,
        checkpoints_to_keep: int,
        on_record: Callable[[dict[str, Any], Checkpoint | None], None] | None = None,
    ) -> None:
        self.storage = storage
        self.on_record = on_record
        self.keep = checkpoints_to_keep
        self.history: list[dict[str, Any]] = []
        self.latest: Checkpoint | None = None
        self._lines: list[str] = []
        self._next_ckpt = 0
        self._kept: list[int] = []
        self.trace_rows: list[dict[str, Any]] = []

    @property
    def path(self) -> str:
        return self.storage.uri

    def open(
        self, config: dict[str, Any], *, resume: bool, start_from: Checkpoint | None = None
    ) -> Checkpoint | None:
        """Create (or, with ``resume``, reopen) the run directory. Returns the checkpoint
        to start from: the last committed one, or ``start_from`` for a new run."""
        exists = self.storage.exists(CONFIG_FILE)
        if exists and not resume:
            raise ConfigError(
                f"run directory {self.storage.uri} already exists; pass resume=True "
                "(RunConfig.resume) to continue it, or choose another name"
            )
        self.storage.makedirs()
        self.storage.write_text(CONFIG_FILE, json.dumps(config, indent=2, default=str))
        if not resume:
            # A checkpoint from elsewhere precedes every report of this run.
            if start_from is not None:
                self.latest = Checkpoint(
                    start_from.path, metadata={**start_from.metadata, "report": -1}, data=start_from.to_bytes()
                )
            return self.latest
        if not exists:
            log.warning("resume=True but %s holds no run yet; starting from scratch", self.storage.uri)
            return None
        committed = self.storage.list_checkpoints()
        last_report = -1
        if committed:
            newest = committed[-1]
            self.latest = Checkpoint(newest.path, metadata=newest.meta)
            self._next_ckpt = newest.index + 1
            self._kept = [c.index for c in committed]
            last_report = int(newest.meta.get("report", -1))
        if self.storage.exists(METRICS_FILE):
            for line in self.storage.read_text(METRICS_FILE).splitlines():
                if line.strip():
                    self._lines.append(line)
                    row = json.loads(line)
                    self.history.append({k: v for k, v in row.items() if not k.startswith("_")})
        self._truncate(last_report + 1)
        return self.latest

    def rollback(self) -> None:
        """Forget reports after the last committed checkpoint: a restart from it will
        report those steps again."""
        last = int(self.latest.metadata.get("report", -1)) if self.latest is not None else -1
        self._truncate(last + 1)

    def _truncate(self, num_reports: int) -> None:
        if num_reports >= len(self.history) and self.storage.exists(METRICS_FILE):
            return
        del self.history[num_reports:]
        del self._lines[num_reports:]
        self.storage.write_text(METRICS_FILE, "".join(f"{ln}\n" for ln in self._lines))

    def record(self, report: Report, *, num_workers: int, commit_index: int | None = None) -> None:
        """Record rank 0's ``report``; commit its checkpoint, as ``commit_index`` if given
        (when checkpoints between were lost with the worker that made them)."""
        index = len(self.history)
        self.history.append(report.metrics)
        row = {"_report": index, "_time": report.time, "_workers": num_workers, **report.metrics}
        line = json.dumps(row, default=str)
        self._lines.append(line)
        if self.storage.is_local:
            with open(f"{self.storage.root}/{METRICS_FILE}", "a") as f:
                f.write(line + "\n")
        else:  # object stores cannot append; rewrite the (small) file
            self.storage.write_text(METRICS_FILE, "".join(f"{ln}\n" for ln in self._lines))
        if report.checkpoint is not None:
            if commit_index is not None:
                if commit_index < self._next_ckpt:
                    raise ValueError(f"checkpoint {commit_index} is older than the last committed one")
                self._next_ckpt = commit_index
            self._commit(report, index)
        if self.on_record is not None:
            self.on_record(report.metrics, self.latest if report.checkpoint is not None else None)

    def trace(self, row: dict[str, Any], engine_state: dict[str, Any] | None = None) -> None:
        """Append one row to adaptive.jsonl (and keep the engine's state beside it)."""
        self.trace_rows.append(row)
        line = json.dumps(row, default=str)
        if self.storage.is_local:
            with open(f"{self.storage.root}/{TRACE_FILE}", "a") as f:
                f.write(line + "\n")
        else:
            self.storage.write_text(TRACE_FILE, "".join(json.dumps(r, default=str) + "\n" for r in self.trace_rows))
        if engine_state is not None:
            self.storage.write_text(ENGINE_FILE, json.dumps(engine_state))

    def engine_state(self) -> dict[str, Any] | None:
        if not self.storage.exists(ENGINE_FILE):
            return None
        return json.loads(self.storage.read_text(ENGINE_FILE))

    def _commit(self, report: Report, report_index: int) -> None:
        index = self._next_ckpt
        meta = {"index": index, "report": report_index, "time": report.time, "metrics": report.metrics}
        path = self.storage.commit_checkpoint(index, report.checkpoint or b"", meta)
        self.latest = Checkpoint(path, metadata=meta, data=report.checkpoint)
        self._next_ckpt += 1
        self._kept.append(index)
        while len(self._kept) > self.keep:
            self.storage.delete_checkpoint(self._kept.pop(0))

"""Run-directory storage on any fsspec filesystem, with atomic writes.

Layout of a run directory::

    <storage_path>/<name>/
        config.json             the resolved configuration
        metrics.jsonl           every report of rank 0, in order
        checkpoints/checkpoint_000007/{state.pt, meta.json}

A checkpoint counts only once its ``meta.json`` exists. On a local disk the whole
directory is written under a temporary name and renamed into place (atomic); on
object stores ``meta.json`` is written last and is the commit marker (each object
write is atomic there). Either way a crash mid-write leaves the previous checkpoint
as the latest loadable one.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

STATE_FILE = "state.pt"
META_FILE = "meta.json"
_CKPT_RE = re.compile(r"^checkpoint_(\d{6,})$")


def default_storage_path() -> str:
    return os.path.join(os.path.expanduser("~"), "raylight_results")


@dataclass(frozen=True)
class CommittedCheckpoint:
    index: int
    path: str  # URI of the checkpoint directory
    meta: dict[str, Any]


class RunStorage:
    """Files of one run directory, addressed by paths relative to it."""

    def __init__(self, uri: str) -> None:
        self.fs, root = fsspec.core.url_to_fs(uri)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = root.rstrip("/") if root != "/" else root
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.uri = self.root if self.is_local else f"{protocol}://{self.root.lstrip('/')}"

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def uri_of(self, rel: str) -> str:
        return f"{self.uri}/{rel}" if rel else self.uri

    # -- plain files ----------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._p(rel)))

    def makedirs(self, rel: str = "") -> None:
        self.fs.makedirs(self._p(rel), exist_ok=True)

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open(self._p(rel), "rb") as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file atomically: readers see the old or the new content."""
        path = self._p(rel)
        parent = path.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        if not self.is_local:
            with self.fs.open(path, "wb") as f:
                f.write(data)
            return
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{path.rsplit('/', 1)[1]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    # -- checkpoints --------------------------------------------------------------
    def commit_checkpoint(self, index: int, state: bytes, meta: dict[str, Any]) -> str:
        """Write checkpoint ``index`` atomically and return its URI."""
        name = f"checkpoint_{index:06d}"
        final = self._p(f"checkpoints/{name}")
        meta_bytes = json.dumps(meta, default=str).encode()
        if self.is_local:
            tmp = self._p(f"checkpoints/.tmp-{name}-{uuid.uuid4().hex}")
            os.makedirs(tmp)
            for fname, data in ((STATE_FILE, state), (META_FILE, meta_bytes)):
                with open(f"{tmp}/{fname}", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            if os.path.exists(final):  # a leftover from an earlier attempt at this index
                self.fs.rm(final, recursive=True)
            os.replace(tmp, final)
        else:
            if self.fs.exists(final):
                self.fs.rm(final, recursive=True)
            self.fs.makedirs(final, exist_ok=True)
            with self.fs.open(f"{final}/{STATE_FILE}", "wb") as f:
                f.write(state)
            with self.fs.open(f"{final}/{META_FILE}", "wb") as f:  # commit marker, last
                f.write(meta_bytes)
        return self.uri_of(f"checkpoints/{name}")

    def list_checkpoints(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints, oldest first. Partial writes are skipped."""
        base = self._p("checkpoints")
        if not self.fs.exists(base):
            return []
        found = []
        for entry in self.fs.ls(base, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            match = _CKPT_RE.match(name)
            if not match:
                continue
            try:
                meta = json.loads(self.read_text(f"checkpoints/{name}/{META_FILE}"))
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # never committed
            found.append(
                CommittedCheckpoint(int(match.group(1)), self.uri_of(f"checkpoints/{name}"), meta)
            )
        return sorted(found, key=lambda c: c.index)

    def delete_checkpoint(self, index: int) -> None:
        path = self._p(f"checkpoints/checkpoint_{index:06d}")
        if self.fs.exists(path):
            # Remove the marker first so a crash mid-delete leaves no half checkpoint
            # that still looks committed.
            marker = f"{path}/{META_FILE}"
            if self.fs.exists(marker):
                self.fs.rm(marker)
            self.fs.rm(path, recursive=True)

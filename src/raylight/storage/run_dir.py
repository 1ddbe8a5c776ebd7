"""Run-directory storage on any fsspec filesystem, with atomic writes.

Layout of a run directory::

    <storage_path>/<name>/
        config.json             the resolved configuration
        status.json             running | finished | failed (the last attempt's outcome)
        lease.json              who writes this run now (see lease.py)
        metrics.jsonl           every report of rank 0, in order
        checkpoints/checkpoint_000007/{state.pt, meta.json}
        checkpoints/checkpoint_000008/{__0_0.distcp, __1_0.distcp, .metadata, state.pt, meta.json}
                                the same, sharded: every rank's shards, DCP's manifest

A checkpoint counts only once its ``meta.json`` exists. On a local disk the whole
directory is written under a temporary name, fsynced and renamed into place (atomic; an
existing target is swapped with ``renameat2(RENAME_EXCHANGE)``), then the parent
directory is fsynced; a deleted checkpoint is first renamed away (it disappears at once)
and then removed. On object stores ``meta.json`` is written last and is the commit
marker (each object write is atomic there), and deletes remove it first. Either way a
crash mid-write leaves the previous checkpoint as the latest loadable one, and what a
crash leaves behind (temporary and half-deleted directories) is debris that
``clean_debris`` removes when the run is next opened by its one writer. ``meta.json``
records the size and SHA-256 of ``state.pt``, so a damaged checkpoint is told apart
from a good one without unpickling anything.

A sharded checkpoint's directory is filled by the workers first (each its shards, DCP's
manifest last); the driver then checks the manifest's files are there, writes
``state.pt`` and commits with ``meta.json`` (which records each shard file's size), so
the same rule holds: no ``meta.json``, no checkpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from raylight.base.exceptions import ConfigError

STATE_FILE = "state.pt"
META_FILE = "meta.json"
# A raylight checkpoint inside a Ray Tune checkpoint directory: STATE_FILE beside this
# (a name of its own, so it is never taken for one of Tune's files).
TUNE_META_FILE = "raylight_meta.json"
CHECKPOINTS = "checkpoints"
_CKPT_RE = re.compile(r"^checkpoint_(\d{6,})$")
TMP_PREFIX = ".tmp-"  # files and checkpoint directories being written
TRASH_PREFIX = ".trash-"  # checkpoint directories being deleted
DAMAGED_PREFIX = "damaged-"  # checkpoints that do not load, kept aside for inspection

log = logging.getLogger("raylight")


def default_storage_path() -> str:
    return os.path.join(os.path.expanduser("~"), "raylight_results")


def checkpoint_name(index: int) -> str:
    return f"checkpoint_{index:06d}"


@dataclass(frozen=True)
class CommittedCheckpoint:
    index: int
    path: str  # URI of the checkpoint directory
    meta: dict[str, Any]


@dataclass
class CheckpointScan:
    """What ``checkpoints/`` holds: committed checkpoints (oldest first), those whose
    ``meta.json`` exists but cannot be read (damage), and debris of interrupted writes
    and deletes (names relative to the run directory)."""

    committed: list[CommittedCheckpoint] = field(default_factory=list)
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (index, why)
    debris: list[str] = field(default_factory=list)


def _fsync_dir(path: str) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where directories
    cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _rename_exchange(a: str, b: str) -> bool:
    """Atomically swap the paths ``a`` and ``b`` (Linux renameat2). False where the
    system or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def replace_dir(tmp: str, final: str) -> None:
    """Put directory ``tmp`` at ``final`` in one atomic step, whether or not ``final``
    exists; the old ``final`` (if any) is removed afterwards."""
    try:
        os.rename(tmp, final)  # atomic; fails when final exists and is not empty
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if _rename_exchange(tmp, final):
        shutil.rmtree(tmp)  # now the old directory
        return
    # No exchange on this filesystem: move the old one aside first (readers may see
    # neither for a moment; the committed checkpoints before this index are untouched).
    aside = f"{os.path.dirname(final)}/{TRASH_PREFIX}{os.path.basename(final)}-{uuid.uuid4().hex[:8]}"
    os.rename(final, aside)
    os.rename(tmp, final)
    shutil.rmtree(aside)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary name beside the local file ``path``. When the block ends without an
    error, the temporary file is fsynced and renamed onto ``path`` (readers see the old
    file or the whole new one, never a part) and the directory is fsynced; otherwise it
    is removed. The one home of raylight's atomic local writes."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, f"{TMP_PREFIX}{uuid.uuid4().hex[:12]}-{os.path.basename(path)}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(parent)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write(path: str, data: bytes | str) -> None:
    """Write the whole local file ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def write_committed(fs: Any, directory: str, files: Iterable[tuple[str, bytes]], marker: tuple[str, bytes]) -> None:
    """Write ``files`` (relative names; may be a generator, written one at a time) into
    ``directory`` on any fsspec filesystem, then ``marker`` last: readers that trust a
    directory only once its marker exists never see a part of it (each object write is
    atomic on object stores)."""
    fs.makedirs(directory, exist_ok=True)
    for name, data in itertools.chain(files, [marker]):
        if "/" in name:
            fs.makedirs(f"{directory}/{name.rsplit('/', 1)[0]}", exist_ok=True)
        with fs.open(f"{directory}/{name}", "wb") as f:
            f.write(data)


def state_digest(state: bytes) -> dict[str, Any]:
    return {"state_bytes": len(state), "state_sha256": hashlib.sha256(state).hexdigest()}


def check_state(state: bytes, meta: dict[str, Any]) -> str | None:
    """Why ``state`` is not the one ``meta`` describes, or None (None too for metadata
    written before sizes and digests were recorded)."""
    size, digest = meta.get("state_bytes"), meta.get("state_sha256")
    if size is not None and len(state) != size:
        return f"{STATE_FILE} has {len(state)} bytes, {META_FILE} records {size}"
    if digest is not None and hashlib.sha256(state).hexdigest() != digest:
        return f"{STATE_FILE} does not match the SHA-256 in {META_FILE}"
    return None


# What a sharded checkpoint needs of the run's storage, said where it is found wanting.
SHARED_STORAGE = (
    "Sharded checkpoints (strategy 'fsdp' or 'deepspeed') are written and read by every "
    "worker in the run's storage, so RunConfig.storage_path must be storage that every "
    "worker and the driver reach: a shared filesystem, or an object store (s3://, gs://). "
    "Set storage_path to one, or checkpoint through the driver with "
    "strategy=raylight.FSDP(checkpoint='full')."
)


class ShardsNotFoundError(ConfigError):
    """The workers' shards of a sharded checkpoint are not where the driver looks."""

    def __init__(self, index: int, uri: str, missing: list[str]) -> None:
        super().__init__(
            f"checkpoint {index}: the shard files {missing} the workers wrote are not in {uri} "
            f"as the driver sees it. {SHARED_STORAGE}"
        )
        self.index, self.uri, self.missing = index, uri, missing


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
    def exists(self, rel: str = "") -> bool:
        return bool(self.fs.exists(self._p(rel)))

    def makedirs(self, rel: str = "") -> None:
        path = self._p(rel)
        if self.is_local and not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            _fsync_dir(os.path.dirname(path))
        else:
            self.fs.makedirs(path, exist_ok=True)

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open(self._p(rel), "rb") as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole file atomically: readers see the old or the new content."""
        path = self._p(rel)
        parent = path.rsplit("/", 1)[0]
        if not self.is_local:
            self.fs.makedirs(parent, exist_ok=True)
            with self.fs.open(path, "wb") as f:
                f.write(data)
            return
        os.makedirs(parent, exist_ok=True)
        atomic_write(path, data)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def append_line(self, rel: str, line: str, *, durable: bool) -> None:
        """Append one line (local disk; object stores cannot append: the caller
        rewrites). ``durable``: fsync before returning."""
        with open(self._p(rel), "a") as f:
            f.write(line + "\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())

    def remove(self, rel: str) -> None:
        path = self._p(rel)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=self.fs.isdir(path))

    def entries(self, rel: str = "") -> list[str]:
        """Names directly inside ``rel`` (none if it does not exist)."""
        path = self._p(rel)
        if not self.fs.exists(path):
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(path, detail=False))

    # -- checkpoints --------------------------------------------------------------
    def commit_checkpoint(self, index: int, state: bytes, meta: dict[str, Any]) -> str:
        """Write checkpoint ``index`` atomically and return its URI. ``meta`` is stored
        with the size and SHA-256 of ``state``."""
        name = checkpoint_name(index)
        final = self._p(f"{CHECKPOINTS}/{name}")
        meta_bytes = json.dumps({**meta, **state_digest(state)}, default=str).encode()
        if self.is_local:
            self.makedirs(CHECKPOINTS)
            tmp = self._p(f"{CHECKPOINTS}/{TMP_PREFIX}{name}-{uuid.uuid4().hex}")
            os.makedirs(tmp)
            for fname, data in ((STATE_FILE, state), (META_FILE, meta_bytes)):
                with open(f"{tmp}/{fname}", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            _fsync_dir(tmp)
            replace_dir(tmp, final)
            _fsync_dir(self._p(CHECKPOINTS))
        else:
            if self.fs.exists(final):
                self.fs.rm(final, recursive=True)
            write_committed(self.fs, final, [(STATE_FILE, state)], (META_FILE, meta_bytes))
        return self.uri_of(f"{CHECKPOINTS}/{name}")

    def commit_sharded(self, index: int, state: bytes, meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Commit checkpoint ``index``, whose tensors the workers already wrote into its
        directory (torch's distributed checkpoint, manifest last), and return its URI and
        the metadata committed (``meta`` with the format and the shard files' sizes).

        Checks that the manifest and every shard file it names are there, as this process
        sees the storage; removes anything else in the directory (what an attempt at this
        index that was cut short left); then writes ``state.pt`` (the skeleton) and
        ``meta.json`` last, which commits it. ``meta`` records the shard files' sizes.
        """
        from raylight.storage import sharded

        rel = f"{CHECKPOINTS}/{checkpoint_name(index)}"
        uri = self.uri_of(rel)
        try:
            expected = sharded.shard_files(sharded.read_metadata(uri)) | {sharded.METADATA_FILE}
        except FileNotFoundError:
            expected = {sharded.METADATA_FILE}
        sizes = self._file_sizes(rel)
        missing = sorted(expected - set(sizes))
        if missing:
            raise ShardsNotFoundError(index, uri, missing)
        for name in set(sizes) - expected:
            self.remove(f"{rel}/{name}")
        meta = {**meta, "format": "sharded", "files": {name: sizes[name] for name in sorted(expected)}}
        meta_bytes = json.dumps({**meta, **state_digest(state)}, default=str).encode()
        if self.is_local:
            path = self._p(rel)
            with open(f"{path}/{STATE_FILE}", "wb") as f:
                f.write(state)
                f.flush()
                os.fsync(f.fileno())
            atomic_write(f"{path}/{META_FILE}", meta_bytes)  # the commit
            _fsync_dir(self._p(CHECKPOINTS))
        else:
            write_committed(self.fs, self._p(rel), [(STATE_FILE, state)], (META_FILE, meta_bytes))
        return uri, meta

    def _file_sizes(self, rel: str) -> dict[str, int]:
        """Name -> size of the files directly inside ``rel`` (none if it does not exist)."""
        path = self._p(rel)
        if not self.fs.exists(path):
            return {}
        return {
            entry["name"].rstrip("/").rsplit("/", 1)[-1]: int(entry.get("size") or 0)
            for entry in self.fs.ls(path, detail=True)
            if entry.get("type") != "directory"
        }

    def check_shards(self, index: int, meta: dict[str, Any]) -> str | None:
        """Why the shard files of sharded checkpoint ``index`` are not the ones ``meta``
        recorded (a file missing or of another size), or whose manifest does not load safely
        or names shard files ``meta`` does not record; None when they are."""
        sizes = self._file_sizes(f"{CHECKPOINTS}/{checkpoint_name(index)}")
        recorded = meta.get("files") or {}
        for name, size in recorded.items():
            if name not in sizes:
                return f"its shard file {name} is missing"
            if sizes[name] != size:
                return f"its shard file {name} has {sizes[name]} bytes, {META_FILE} records {size}"
        if meta.get("format") != "sharded":
            return None
        from raylight.storage import sharded

        try:  # a manifest of the recorded size can still be garbled or hostile
            named = sharded.shard_files(sharded.read_metadata(self.uri_of(f"{CHECKPOINTS}/{checkpoint_name(index)}")))
        except (sharded.ManifestError, OSError) as exc:
            return str(exc)
        unrecorded = sorted(named - set(recorded))
        if unrecorded:
            return f"its manifest {sharded.METADATA_FILE} names shard files {META_FILE} does not record: {unrecorded}"
        return None

    def clear_uncommitted(self, first: int) -> list[str]:
        """Remove checkpoint directories numbered ``first`` or above that were never
        committed (no ``meta.json``): shards of an attempt that failed before the driver
        committed them. Only the run's one writer calls this, while no worker writes."""
        removed = []
        for name in self.entries(CHECKPOINTS):
            match = _CKPT_RE.match(name)
            rel = f"{CHECKPOINTS}/{name}"
            if match and int(match.group(1)) >= first and not self.exists(f"{rel}/{META_FILE}"):
                self.remove(rel)
                removed.append(rel)
        return removed

    def scan_checkpoints(self) -> CheckpointScan:
        """Committed checkpoints, damaged ones and debris (see ``CheckpointScan``)."""
        scan = CheckpointScan()
        for name in self.entries(CHECKPOINTS):
            rel = f"{CHECKPOINTS}/{name}"
            if name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                scan.debris.append(rel)
                continue
            match = _CKPT_RE.match(name)
            if not match:
                continue  # not ours (damaged-..., a user's file): left alone
            index = int(match.group(1))
            if not self.exists(f"{rel}/{META_FILE}"):
                scan.debris.append(rel)  # never committed, or a delete that was cut short
                continue
            try:
                meta = json.loads(self.read_text(f"{rel}/{META_FILE}"))
                if not isinstance(meta, dict):
                    raise ValueError(f"{META_FILE} holds {type(meta).__name__}, not an object")
            except (ValueError, UnicodeDecodeError, OSError) as exc:
                scan.unreadable.append((index, f"{META_FILE} cannot be read: {exc}"))
                continue
            scan.committed.append(CommittedCheckpoint(index, self.uri_of(rel), meta))
        scan.committed.sort(key=lambda c: c.index)
        return scan

    def list_checkpoints(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints, oldest first. Partial writes are skipped."""
        return self.scan_checkpoints().committed

    def read_state(self, index: int) -> bytes:
        return self.read_bytes(f"{CHECKPOINTS}/{checkpoint_name(index)}/{STATE_FILE}")

    def delete_checkpoint(self, index: int) -> None:
        rel = f"{CHECKPOINTS}/{checkpoint_name(index)}"
        path = self._p(rel)
        if self.is_local:
            if not os.path.exists(path):
                return
            # Gone from the listing in one step; a crash before the removal ends leaves
            # a .trash- directory, which the next open removes.
            aside = self._p(f"{CHECKPOINTS}/{TRASH_PREFIX}{checkpoint_name(index)}-{uuid.uuid4().hex[:8]}")
            os.rename(path, aside)
            _fsync_dir(self._p(CHECKPOINTS))
            shutil.rmtree(aside)
            return
        if self.fs.exists(path):
            # The marker first: a crash mid-delete leaves no half checkpoint that still
            # looks committed.
            marker = f"{path}/{META_FILE}"
            if self.fs.exists(marker):
                self.fs.rm(marker)
            self.fs.rm(path, recursive=True)

    def set_aside(self, index: int) -> str:
        """Move a checkpoint that does not load out of the way (kept for inspection as
        ``checkpoints/damaged-checkpoint_NNNNNN-<id>``); returns its new name."""
        name = checkpoint_name(index)
        target = f"{CHECKPOINTS}/{DAMAGED_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
        if self.is_local:
            os.rename(self._p(f"{CHECKPOINTS}/{name}"), self._p(target))
            _fsync_dir(self._p(CHECKPOINTS))
        else:
            self.fs.mv(self._p(f"{CHECKPOINTS}/{name}"), self._p(target), recursive=True)
        return target

    def clean_debris(self, scan: CheckpointScan | None = None) -> list[str]:
        """Remove what interrupted writes and deletes left (only the run's one writer
        may call this: on object stores a checkpoint being written looks the same).
        Returns the names removed, relative to the run directory."""
        scan = scan or self.scan_checkpoints()
        removed = list(scan.debris)
        removed += [name for name in self.entries() if name.startswith(TMP_PREFIX)]
        for rel in removed:
            with contextlib.suppress(FileNotFoundError):
                self.remove(rel)
        if removed and self.is_local:
            _fsync_dir(self._p(CHECKPOINTS))
        return removed

"""Whether every worker reaches the run's storage, checked before training (issue 57).

A run with sharded checkpoints has every worker write its shards into the run's storage
itself, so a ``storage_path`` on the driver's own disk works only where every worker is on
that machine (or the path is a shared filesystem mounted at the same place everywhere).
Found out at the first commit, that is a run that trains until its first checkpoint and
then fails (``ShardsNotFoundError``); found out here, it fails before training, once.

The driver writes a marker file, with a token of this launch, into the nearest directory
of the run's path that exists (the run directory appears only when training starts: see
``raylight.driver.recorder``); each worker looks for that file at the same path and says
what it found (``unseen``); the driver removes the marker and raises one ``ConfigError``
naming the hosts that did not see it and what the storage must be (``SHARED_STORAGE``).
Object stores (``s3://``, ``gs://``) are reached by URI from everywhere: not checked.
Pure file operations, no Ray: the worker group runs ``unseen`` on its workers.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from raylight.base.exceptions import ConfigError
from raylight.storage.run_dir import SHARED_STORAGE

MARKER_PREFIX = ".raylight-reach-"


@dataclass(frozen=True)
class Marker:
    """The file the driver wrote (an absolute path) and the token it holds."""

    path: str
    token: str


def local_path(uri: str) -> str | None:
    """The path of ``uri`` on this machine's filesystem, or None for an object store."""
    fs, root = fsspec.core.url_to_fs(uri)
    return os.path.abspath(root) if isinstance(fs, LocalFileSystem) else None


def nearest_existing(path: str) -> str:
    """``path`` itself, or its closest ancestor that exists."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


@contextlib.contextmanager
def marker(uri: str) -> Iterator[Marker | None]:
    """A marker for the storage at ``uri`` while the block runs (None: an object store,
    which every worker reaches by its URI). Removed on the way out."""
    path = local_path(uri)
    if path is None:
        yield None
        return
    token = uuid.uuid4().hex
    found = Marker(os.path.join(nearest_existing(path), f"{MARKER_PREFIX}{token}"), token)
    try:
        with open(found.path, "x") as f:
            f.write(token)
    except OSError as exc:
        raise ConfigError(
            f"cannot write to the run's storage {uri} (tried {found.path}: {exc.strerror}); "
            "fix RunConfig.storage_path"
        ) from None
    try:
        yield found
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(found.path)


def unseen(path: str, token: str) -> str | None:
    """On a worker: None where ``path`` holds ``token`` (this process sees the driver's
    marker), else what it found instead."""
    try:
        with open(path) as f:
            held = f.read()
    except FileNotFoundError:
        return f"{path} does not exist here"
    except OSError as exc:
        return f"{path} cannot be read here ({exc.strerror})"
    if held != token:  # another launch's marker at the same path: another filesystem
        return f"{path} holds another run's marker"
    return None


def not_reached_error(uri: str, missing: dict[str, str]) -> ConfigError:
    """The run's storage is not where the workers on ``missing`` (host -> what it found)
    look: what the run needs, and how to give it."""
    hosts = "; ".join(f"on {host}: {why}" for host, why in sorted(missing.items()))
    return ConfigError(
        f"RunConfig.storage_path: the run's storage {uri} is not shared with every worker: "
        f"the driver wrote a marker there, and workers did not see it ({hosts}). {SHARED_STORAGE}"
    )

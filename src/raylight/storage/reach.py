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
An object store (``s3://``, ``gs://``) has one namespace for every host, but each host
reaches it with its own endpoint, credentials and route: the marker goes under the run's
path there, and a worker that cannot read it (no route to the endpoint, no or other
credentials) says what its client answered. Each worker's read is bounded (``timeout_s``).
Pure file operations, no Ray: the worker group runs ``unseen`` on its workers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from raylight.base.exceptions import ConfigError
from raylight.storage.run_dir import SHARED_STORAGE

MARKER_PREFIX = ".raylight-reach-"
OBJECT_STORE = (
    "An object store is reached by each host with its own settings: give every node of the "
    "cluster the same endpoint and credentials (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY in the environment `ray start` runs with, or ~/.aws/config and "
    "~/.aws/credentials of the user Ray runs as; see docs/cluster.md) and a route to the endpoint."
)


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
def marker(uri: str) -> Iterator[Marker]:
    """A marker for the storage at ``uri`` while the block runs, removed on the way out: in
    the nearest directory of a local path that exists, under the run's path in an object
    store (where directories need not exist)."""
    token = uuid.uuid4().hex
    path = local_path(uri)
    if path is None:
        found = Marker(f"{uri.rstrip('/')}/{MARKER_PREFIX}{token}", token)
    else:
        found = Marker(os.path.join(nearest_existing(path), f"{MARKER_PREFIX}{token}"), token)
    try:
        if path is None:
            with fsspec.open(found.path, "wb") as f:
                f.write(token.encode())
        else:
            with open(found.path, "x") as f:
                f.write(token)
    except Exception as exc:  # OSError locally; an object store's client raises its own
        hint = f" {OBJECT_STORE}" if path is None else ""
        raise ConfigError(
            f"cannot write to the run's storage {uri} (tried {found.path}: {_why(exc)}); "
            f"fix RunConfig.storage_path.{hint}"
        ) from None
    try:
        yield found
    finally:
        _remove(found.path, local=path is not None)


def _remove(path: str, *, local: bool) -> None:
    if local:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    with contextlib.suppress(Exception):  # best effort: a leftover marker is a small file
        fs, inner = fsspec.core.url_to_fs(path)
        fs.rm(inner)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def unseen(path: str, token: str, timeout_s: float = 60.0) -> str | None:
    """On a worker: None where ``path`` holds ``token`` (this process sees the driver's
    marker), else what it found instead. An object store's read that has not answered
    within ``timeout_s`` counts as not reached."""
    if "://" not in path:
        return _unseen_local(path, token)
    held: list[bytes | BaseException] = []

    def read() -> None:
        try:
            with fsspec.open(path, "rb") as f:
                held.append(f.read())
        except BaseException as exc:  # reported to the driver, whatever the client raised
            held.append(exc)

    reader = threading.Thread(target=read, name="raylight-reach", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not held:
        # the driver gives half of FailureConfig.worker_start_timeout_s (ray_group._check_reach)
        return f"{path} could not be read here within {timeout_s:g} s (half of FailureConfig.worker_start_timeout_s)"
    found = held[0]
    if isinstance(found, FileNotFoundError):
        return f"{path} does not exist here"
    if isinstance(found, BaseException):
        return f"{path} cannot be read here ({_why(found)})"
    return None if found == token.encode() else f"{path} holds another run's marker"


def _unseen_local(path: str, token: str) -> str | None:
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
    if local_path(uri) is None:
        return ConfigError(
            f"RunConfig.storage_path: the run's storage {uri} is not reached by every worker: "
            f"the driver wrote a marker there, and workers could not read it ({hosts}). {OBJECT_STORE}"
        )
    return ConfigError(
        f"RunConfig.storage_path: the run's storage {uri} is not shared with every worker: "
        f"the driver wrote a marker there, and workers did not see it ({hosts}). {SHARED_STORAGE}"
    )

"""Sharded checkpoints: every rank writes its own shards with ``torch.distributed.checkpoint``
(DCP); the rest of the state is a small *skeleton* that the driver commits beside them.

A checkpoint state is split in two:

- its tensors (``DTensor`` shards and replicated plain tensors), flattened to keys like
  ``model.0.weight`` or ``opt.state.model.0.weight.exp_avg`` (the path joined with dots),
  which DCP writes in parallel, each rank its own shards (a replicated tensor once);
- the skeleton: the same structure with each tensor replaced by a placeholder naming its
  key, plus every number, string and list. It is small, serialised by rank 0 like a full
  checkpoint's state and committed by the driver as ``state.pt``, after the shards.

Loading reshards: DCP reads into tensors laid out for the *current* world size, so a
checkpoint written by 2 ranks loads into 1 or 3. ``load_full`` rebuilds the whole state
with plain tensors in one process, without ``torch.distributed``.

Nothing here ever unpickles arbitrary objects: only tensors go through DCP (which reads
them with ``weights_only=True``), and DCP's ``.metadata`` file, a pickle, is read with an
unpickler that admits only the metadata's own classes, so a checkpoint can never run code.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from raylight.base.exceptions import RaylightError
from raylight.storage.run_dir import SHARED_STORAGE

if TYPE_CHECKING:
    from torch.distributed.checkpoint import metadata as dcp_metadata

# torch.distributed.checkpoint takes 0.6 s to import: every worker and driver imports this
# module, only runs that write or read sharded checkpoints need it, and they import it here.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"


def _dcp_metadata() -> Any:
    from torch.distributed.checkpoint import metadata

    return metadata

TENSOR_REF = "\x00raylight.tensor"  # placeholder key: {TENSOR_REF: "<dcp key>"}
METADATA_FILE = ".metadata"  # DCP's manifest, written last by its coordinator rank


# -- splitting a state into tensors and skeleton ------------------------------------------
def split(state: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """``state`` as (skeleton, {key: tensor}). Keys are the path of each tensor joined
    with dots; two paths that give the same key (``{"a.b": t}`` beside ``{"a": {"b": t}}``)
    are an error naming both."""
    tensors: dict[str, torch.Tensor] = {}
    paths: dict[str, str] = {}

    def walk(value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            key = ".".join(str(p) for p in path)
            if key in tensors:
                raise ValueError(
                    f"checkpoint entries {paths[key]} and {_show(path)} both flatten to "
                    f"{key!r}; rename one of them"
                )
            tensors[key] = value
            paths[key] = _show(path)
            return {TENSOR_REF: key}
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [walk(v, (*path, i)) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    start = (prefix,) if prefix else ()
    return walk(state, start), tensors


def join(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The state ``split`` took apart, each placeholder replaced by its tensor."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {TENSOR_REF}:
            return tensors[skeleton[TENSOR_REF]]
        return {k: join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        items = [join(v, tensors) for v in skeleton]
        return items if isinstance(skeleton, list) else tuple(items)
    return skeleton


def tensor_keys(skeleton: Any) -> Iterator[str]:
    """Every tensor key a skeleton refers to."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {TENSOR_REF}:
            yield skeleton[TENSOR_REF]
            return
        for value in skeleton.values():
            yield from tensor_keys(value)
    elif isinstance(skeleton, list | tuple):
        for value in skeleton:
            yield from tensor_keys(value)


def _show(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path)


# -- storage --------------------------------------------------------------------------
def _is_local(uri: str) -> tuple[bool, str]:
    fs, root = fsspec.core.url_to_fs(uri)
    return isinstance(fs, LocalFileSystem), root


# Exact (module, name) pairs: what DCP's own manifest is made of, nothing module-wide and
# no dotted names (protocol 4 resolves "a.b" as an attribute path from the module's
# globals, so a module-wide allowance would admit everything the module imports).
_SAFE_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
    )),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),  # the checkpoint id a local writer records
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
})


class ManifestError(RaylightError):
    """A sharded checkpoint's ``.metadata`` is not DCP metadata raylight can read safely
    (refused names, not a pickle, cut short): the checkpoint counts as damaged."""


def _torch_constant(module: str, name: str) -> bool:
    """``torch.<name>`` is a dtype, memory format or layout (``torch.float32``)."""
    return module == "torch" and name.isidentifier() and isinstance(
        getattr(torch, name, None), torch.dtype | torch.memory_format | torch.layout
    )


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only what DCP's metadata is made of (its classes, torch sizes, dtypes,
    layouts and memory formats), by exact name; anything else is refused before it is
    imported."""

    def find_class(self, module: str, name: str) -> Any:
        if "." in name or not ((module, name) in _SAFE_GLOBALS or _torch_constant(module, name)):
            raise pickle.UnpicklingError(
                f"{module}.{name} is not allowed: raylight loads only DCP's own metadata types, "
                "so a checkpoint can never run code"
            )
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent references are not allowed")


def read_metadata(uri: str) -> dcp_metadata.Metadata:
    """DCP's manifest of the checkpoint at ``uri``, read safely. A missing manifest raises
    FileNotFoundError; one that is refused or does not load raises ``ManifestError``
    naming the file."""
    path = f"{uri.rstrip('/')}/{METADATA_FILE}"
    with fsspec.open(path, "rb") as f:
        data = f.read()
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # refused names, a cut-short or garbled pickle, bad arguments
        raise ManifestError(
            f"the sharded checkpoint manifest {path} is refused: {type(exc).__name__}: {exc}. "
            "It is not the manifest DCP wrote (damaged or tampered with); the checkpoint is "
            "treated as damaged"
        ) from None
    if not isinstance(metadata, _dcp_metadata().Metadata):
        raise ManifestError(
            f"the sharded checkpoint manifest {path} holds {type(metadata).__name__}, not DCP metadata; "
            "the checkpoint is treated as damaged"
        )
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict):
        raise ManifestError(f"the sharded checkpoint manifest {path} has no table of tensors; the checkpoint is treated as damaged")
    others = sorted(str(key) for key, info in entries.items() if not isinstance(info, _dcp_metadata().TensorStorageMetadata))
    if others:  # DCP reads a bytes entry with torch.load(weights_only=False): raylight writes only tensors
        raise ManifestError(
            f"the sharded checkpoint manifest {path} records entries that are not tensors ({others[:3]}); "
            "raylight writes only tensors there, so the checkpoint is treated as damaged"
        )
    return metadata


def shard_files(metadata: dcp_metadata.Metadata) -> set[str]:
    """The files (relative to the checkpoint directory) that hold the tensors."""
    storage = metadata.storage_data or {}
    return {info.relative_path for info in storage.values()}


def _reader(uri: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    local, root = _is_local(uri)
    base: Any = FileSystemReader if local else FsspecReader

    class SafeReader(base):
        def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
            metadata = read_metadata(uri)
            storage_meta = getattr(metadata, "storage_meta", None) or _dcp_metadata().StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            return metadata

    return SafeReader(root if local else uri)


def _writer(uri: str) -> Any:
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    local, root = _is_local(uri)
    if local:
        return FileSystemWriter(root, sync_files=True)  # each file fsynced before it counts
    return FsspecWriter(uri)


def save(tensors: dict[str, torch.Tensor], uri: str) -> None:
    """Write ``tensors`` into the directory ``uri``: each rank its shards, a replicated
    tensor once, the manifest last. A collective: every rank calls it with the same keys."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(tensors, storage_writer=_writer(uri))
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise RuntimeError(f"cannot write the sharded checkpoint {uri}: {_first_line(exc)}{_storage_hint(uri)}") from exc


def load_into(template: dict[str, torch.Tensor], uri: str, *, collective: bool) -> None:
    """Fill ``template`` (tensors laid out as this rank wants them, e.g. DTensor shards of
    the current world size) from the checkpoint at ``uri``, in place. ``collective``: every
    rank calls it (they plan the reads together); else this process reads alone."""
    if not template:
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            dcp.load(template, storage_reader=_reader(uri), no_dist=not collective)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        raise RuntimeError(f"cannot load the sharded checkpoint {uri}: {_first_line(exc)}{_storage_hint(uri)}") from exc


def _storage_hint(uri: str) -> str:
    """For a checkpoint on a local path: what the run's storage must be, and whether this
    process sees the directory at all (a worker on another machine does not see the
    driver's disk)."""
    local, root = _is_local(uri)
    if not local:
        return ""
    import os
    import socket

    seen = "" if os.path.isdir(root) else f" This process (on {socket.gethostname()}) does not see {root}."
    return f".{seen} {SHARED_STORAGE}"


def load_full(skeleton: Any, uri: str, keys: set[str] | None = None) -> Any:
    """The state of the checkpoint at ``uri`` with plain, whole tensors, in this process
    alone (no process group needed). ``keys``: only those tensors are read (the others
    stay placeholders)."""
    wanted = set(tensor_keys(skeleton)) if keys is None else keys
    metadata = read_metadata(uri)
    template: dict[str, torch.Tensor] = {}
    for key in wanted:
        info = metadata.state_dict_metadata.get(key)
        if not isinstance(info, _dcp_metadata().TensorStorageMetadata):
            raise KeyError(f"the sharded checkpoint {uri} has no tensor {key!r}")
        template[key] = torch.empty(info.size, dtype=info.properties.dtype)
    load_into(template, uri, collective=False)
    return join(skeleton, _with_placeholders(skeleton, template))


def _with_placeholders(skeleton: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``tensors``, with every other key of ``skeleton`` mapped back to its placeholder."""
    out: dict[str, Any] = {key: {TENSOR_REF: key} for key in tensor_keys(skeleton)}
    out.update(tensors)
    return out


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message; of a DCP ``CheckpointException`` (a
    BaseException that gathers every rank's error), that of the lowest rank's error."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        cause = failures[min(failures)]
        if isinstance(cause, tuple) and cause and isinstance(cause[0], BaseException):
            return f"rank {min(failures)}: {_first_line(cause[0])}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

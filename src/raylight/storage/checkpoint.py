"""Checkpoints: the user's state dict, serialised with torch and loaded safely.

A checkpoint's state is a dict of tensors, numbers, strings, lists and nested dicts
(model and optimizer ``state_dict()`` included). It is serialised once, where it is
reported, and loaded with ``torch.load(weights_only=True)`` so a checkpoint file can
never run code.

Two formats, one interface. A *full* checkpoint's ``state.pt`` holds the whole state. A
*sharded* one (FSDP and DeepSpeed runs) holds its tensors as shards that every rank wrote
with torch's distributed checkpoint (``sharded.py``) and, in ``state.pt``, the skeleton
of the rest; ``load()`` reassembles the whole state with plain tensors, in any process.
"""

from __future__ import annotations

import io
from typing import Any

import fsspec

from raylight.base.exceptions import ConfigError
from raylight.storage.run_dir import STATE_FILE

RAYLIGHT_KEY = "_raylight"  # reserved key: raylight's own state (loader positions, ...)
# Metric names under this prefix are raylight's own markers on a report, not user metrics:
INTERNAL_METRIC = "raylight/internal"  # a report for raylight itself (never sent to Tune)
LIGHTNING_CKPT_METRIC = "raylight/lightning_checkpoint"  # the checkpoint holds a .ckpt file
LIGHTNING_CKPT_KEY = "lightning_checkpoint"  # ... its bytes (uint8 tensor), with "filename"
SHARDED = "sharded"  # the format of a checkpoint whose tensors are DCP shards (own["format"])


def serialize_state(state: dict[str, Any]) -> bytes:
    import torch

    if not isinstance(state, dict):
        raise TypeError(
            f"a checkpoint must be a dict (e.g. {{'model': model.state_dict()}}), "
            f"got {type(state).__name__}"
        )
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def deserialize_state(data: bytes, source: str = "a checkpoint") -> dict[str, Any]:
    """The state ``torch.save`` wrote, loaded with ``weights_only=True``; a pickle that
    names anything else (a function to call, a class outside torch's allow-list) is an
    ``UnpicklingError`` naming ``source`` (the file), before any of it runs, and a state
    that is not a dict a ``ConfigError`` naming it."""
    import pickle

    import torch

    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(refused_pickle(source, exc)) from None
    if not isinstance(state, dict):  # a file raylight did not write: its loaders need a dict
        raise ConfigError(
            f"{source} holds a {type(state).__name__}, not a dict: a raylight checkpoint is the "
            "dict a loop reported (ctx.report(..., checkpoint={'model': model.state_dict(), ...})). "
            "Start from a checkpoint a raylight run committed, or save the state as a dict "
            "(torch.save({'model': model.state_dict()}, '<dir>/state.pt'))"
        )
    return state


def refusal_reason(exc: BaseException) -> str:
    """The line of a weights-only load's error that says what it refused."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith(boilerplate)), type(exc).__name__)


def refused_pickle(source: str, exc: BaseException) -> str:
    """What a user reads when a weights-only load refused ``source``: torch's reason (the
    global it refused), without its advice to load the file unsafely."""
    reason = refusal_reason(exc)
    return (
        f"{source} holds more than tensors and plain values, so raylight does not load it "
        f"(a weights only load, torch.load(weights_only=True), refused it: {reason}). "
        "Loading it would run code the file chooses: it was not written by raylight, or it was "
        "changed since. Use a checkpoint you trust, of dicts of state_dict()s, tensors, numbers "
        "and strings."
    )


class Checkpoint:
    """A committed checkpoint: where it is stored, and ``load()`` to get the state back.

    Attributes:
        path: URI of the checkpoint directory (``None`` for an in-memory checkpoint).
        metadata: the report index, step and metrics recorded when it was committed.
    """

    def __init__(
        self,
        path: str | None,
        *,
        metadata: dict[str, Any] | None = None,
        data: bytes | None = None,
    ) -> None:
        if path is None and data is None:
            raise ValueError("a Checkpoint needs a path or data")
        self.path = path
        self.metadata = dict(metadata or {})
        self._data = data
        self._state: dict[str, Any] | None = None  # deserialized once, handed to load() once

    def to_bytes(self) -> bytes:
        if self._data is None:
            assert self.path is not None
            with fsspec.open(f"{self.path}/{STATE_FILE}", "rb") as f:
                self._data = f.read()
        return self._data

    def full_state(self) -> dict[str, Any]:
        """The stored ``state.pt``, raylight's own part included (for a sharded checkpoint,
        the skeleton: tensors are placeholders); deserialized once and kept until
        ``load()`` takes it."""
        if self._state is None:
            self._state = deserialize_state(self.to_bytes(), self._source())
        return self._state

    @property
    def sharded(self) -> bool:
        """Whether the tensors are shards beside ``state.pt`` (FSDP and DeepSpeed runs)."""
        own = self.full_state().get(RAYLIGHT_KEY)
        return isinstance(own, dict) and own.get("format") == SHARDED

    def load(self) -> dict[str, Any]:
        """Return the state dict that was reported, whole, with tensors on the CPU (a
        sharded checkpoint's shards are read and joined in this process; no
        ``torch.distributed`` needed). Each call returns fresh objects (mutating one
        result does not change the next)."""
        sharded = self.sharded
        state, self._state = self._state, None
        if state is None:
            state = deserialize_state(self.to_bytes(), self._source())
        if sharded:
            from raylight.storage import sharded as shards

            state = shards.load_full(state, self._shard_path())
        return {k: v for k, v in state.items() if k != RAYLIGHT_KEY}

    def _source(self) -> str:
        return f"checkpoint file {self.path}/{STATE_FILE}" if self.path is not None else "an in-memory checkpoint"

    def _shard_path(self) -> str:
        if self.path is None:
            raise ValueError(
                "this sharded checkpoint has no directory to read its shards from "
                "(Checkpoint.path is None)"
            )
        return self.path

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r}, index={self.metadata.get('index')})"

    def __reduce__(self):
        return (_rebuild_checkpoint, (self.path, self.metadata, self._data))


def _rebuild_checkpoint(path, metadata, data):
    return Checkpoint(path, metadata=metadata, data=data)


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (in dicts, lists and tuples) detached and in CPU
    memory."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_cpu(v) for v in value)
    return value

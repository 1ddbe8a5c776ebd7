"""``adaptdl.checkpoint``: named pieces of state saved together and loaded after a restart.

A ``State`` subclass says how it saves to and loads from a binary file object. Where
they are kept:
- under `raylight run` (its agent channel is in the environment): in the run's directory,
  one atomic checkpoint per ``save_all_states()`` through ``raylight.run_context()``, which
  a restarted (``--max-failures``) or resumed (``--resume``) run loads;
- else, where ``ADAPTDL_CHECKPOINT_PATH`` is set: files in that directory, as AdaptDL
  writes them (``checkpoint-<restart>/<name>``, renamed into place whole);
- else nowhere (``load_state`` returns False).
"""

from __future__ import annotations

import io
import os
import shutil
from typing import IO, Any

import torch

from raylight.adaptdl import env
from raylight.worker.run_wire import CHANNEL_ENV

CKPT_DIR_PREFIX = "checkpoint-"
_NAMES_TO_STATES: dict[str, State] = {}
_LOADED: list[dict[str, Any] | None] = []  # the run's last checkpoint, fetched once per process


class State:
    """A piece of state saved by ``save_all_states`` under a unique ``name``."""

    def __init__(self, name: str) -> None:
        if name in _NAMES_TO_STATES:
            raise ValueError(f"State '{name}' already exists")
        _NAMES_TO_STATES[name] = self
        self.name = name

    def save(self, fileobj: IO[bytes]) -> None:
        """Write this state to ``fileobj`` (rank 0 only)."""

    def load(self, fileobj: IO[bytes]) -> None:
        """Read this state back from ``fileobj``."""

    def sync(self) -> None:
        """Make this state the same on every replica before it is saved (called on every replica)."""


def _forget(state: State) -> None:
    """Drop ``state`` from the saved set (its name may be used again)."""
    if _NAMES_TO_STATES.get(state.name) is state:
        del _NAMES_TO_STATES[state.name]


def _under_raylight_run() -> bool:
    return bool(os.environ.get(CHANNEL_ENV))


def _serialised(state: State) -> bytes:
    buf = io.BytesIO()
    state.save(buf)
    return buf.getvalue()


def save_all_states() -> str | None:
    """Save every ``State`` (a collective: call it on every replica, at the same point).
    Returns where the checkpoint went (a directory, the run's name, or None)."""
    for state in list(_NAMES_TO_STATES.values()):
        state.sync()
    rank0 = env.replica_rank() == 0
    if _under_raylight_run():
        from raylight.worker.run_channel import run_context

        payload: dict[str, Any] = {}
        if rank0:
            for name, state in _NAMES_TO_STATES.items():
                data = _serialised(state)
                payload[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        run_context().report({"adaptdl_states": len(_NAMES_TO_STATES)}, checkpoint=payload)
        return env.job_id()
    root = env.checkpoint_path()
    if root is None or not rank0:
        return root
    tmp = os.path.join(root, "_checkpoint")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, state in _NAMES_TO_STATES.items():
        with open(os.path.join(tmp, name), "wb") as f:
            state.save(f)
    final = os.path.join(root, f"{CKPT_DIR_PREFIX}{env.num_restarts()}")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)  # whole or not at all
    for entry in os.listdir(root):
        if entry.startswith(CKPT_DIR_PREFIX) and os.path.join(root, entry) != final:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    return root


def save_state(state: State, checkpoint_dir: str | None = None, sync: bool = True) -> None:
    """AdaptDL saves one state at a time; here a checkpoint is every state at once, so this
    saves them all (``save_all_states``)."""
    save_all_states()


def _run_checkpoint() -> dict[str, Any] | None:
    if not _LOADED:
        from raylight.worker.run_channel import run_context

        _LOADED.append(run_context().load_checkpoint())
    return _LOADED[0]


def _latest_dir(root: str) -> str | None:
    if not os.path.isdir(root):
        return None
    restarts = [int(d[len(CKPT_DIR_PREFIX):]) for d in os.listdir(root)
                if d.startswith(CKPT_DIR_PREFIX) and d[len(CKPT_DIR_PREFIX):].isdigit()]
    return os.path.join(root, f"{CKPT_DIR_PREFIX}{max(restarts)}") if restarts else None


def load_state(state: State) -> bool:
    """Load ``state`` from the last checkpoint; True when it was in it (``State.load`` ran)."""
    if _under_raylight_run():
        saved = _run_checkpoint()
        if not saved or state.name not in saved:
            return False
        state.load(io.BytesIO(saved[state.name].numpy().tobytes()))
        return True
    root = env.checkpoint_path()
    latest = _latest_dir(root) if root else None
    path = os.path.join(latest, state.name) if latest else None
    if path is None or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        state.load(f)
    return True

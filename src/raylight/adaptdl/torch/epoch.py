"""``adaptdl.torch.remaining_epochs_until``: the epoch loop that resumes where a restarted
run stopped. Every finished epoch ends with a checkpoint of every ``State``
(``adaptdl.checkpoint.save_all_states``), so that a run killed mid-epoch repeats that
epoch only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

import torch

from raylight.adaptdl import checkpoint


class _EpochState(checkpoint.State):
    def __init__(self) -> None:
        super().__init__("adaptdl-epoch")
        self.finished = 0
        self.current: int | None = None

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({"finished": self.finished}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self.finished = int(torch.load(fileobj, weights_only=True)["finished"])


_STATE: list[_EpochState] = []


def _epoch_state() -> _EpochState:
    if not _STATE:
        state = _EpochState()
        checkpoint.load_state(state)
        _STATE.append(state)
    return _STATE[0]


def remaining_epochs_until(epoch: int) -> Iterator[int]:
    """The epochs from the first unfinished one up to ``epoch`` (exclusive); after each,
    every State is checkpointed (a collective: every replica runs the same loop)."""
    state = _epoch_state()
    if state.current is not None:
        raise RuntimeError("remaining_epochs_until() is already running: nest no epoch loops")
    try:
        while state.finished < epoch:
            state.current = state.finished
            yield state.current
            state.finished += 1
            state.current = None
            checkpoint.save_all_states()
    finally:
        state.current = None


def current_epoch() -> int | None:
    """The epoch ``remaining_epochs_until`` is in, or None outside it."""
    return _epoch_state().current


def finished_epochs() -> int:
    """How many epochs have finished, restarts included."""
    return _epoch_state().finished

"""``adaptdl.torch.Accumulator``: AdaptDL's metric sums on raylight's ``Accumulator``
(``raylight.worker.adaptive.state``), saved with the run's checkpoints.

Each is a ``State`` named by the epoch it was made in and its place among that epoch's
(AdaptDL's keys), so a script that makes a new one each epoch gets, after a restart, the
sums of the same epoch's accumulator, never an earlier epoch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import IO, Any

import torch

from raylight.adaptdl import checkpoint, env
from raylight.adaptdl.torch.epoch import current_epoch
from raylight.worker.adaptive.state import Accumulator as _Sums

_COUNTS: dict[Any, int] = {}  # how many accumulators each epoch made so far


class Accumulator(MutableMapping[str, Any]):
    """Sums across replicas: add on every replica (``acc["correct"] += n``), read the totals
    inside ``with acc.synchronized():`` (a collective); there, writes change the totals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sums = _Sums(world_size=env.num_replicas())
        self._inside = False
        self._writes: dict[str, float] = {}
        epoch = current_epoch()
        count = _COUNTS.get(epoch, 0)
        _COUNTS[epoch] = count + 1
        self._state = _AccumulatorState(self._sums, f"adaptdl-accumulator-epoch{epoch}-{count}")
        checkpoint.load_state(self._state)
        self.update(*args, **kwargs)

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[Accumulator]:
        with self._sums.synchronized():
            self._inside = True
            self._writes = {}
            try:
                yield self
            finally:
                self._inside = False
        totals = self._writes
        for key, delta in totals.items():  # the change every replica made alike, added once
            if env.replica_rank() == 0:
                self._sums[key] = self._sums[key] + delta

    def __getitem__(self, key: str) -> Any:
        value = self._sums[key]
        return value + self._writes.get(key, 0.0) if self._inside else value

    def __setitem__(self, key: str, value: Any) -> None:
        if self._inside:
            self._writes[key] = float(value) - float(self._sums[key])
        else:
            self._sums[key] = value

    def __delitem__(self, key: str) -> None:
        del self._sums[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sums)

    def __len__(self) -> int:
        return len(self._sums)

    def __contains__(self, key: object) -> bool:
        return key in list(self._sums)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add (AdaptDL's update adds, as ``+=``) each value of a mapping or keywords."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = self[key] + value

    def subtract(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = self[key] - value

    def __iadd__(self, other: Any) -> Accumulator:
        self.update(other)
        return self

    def __isub__(self, other: Any) -> Accumulator:
        self.subtract(other)
        return self

    def __repr__(self) -> str:
        return f"Accumulator({dict(self.items())})"


class _AccumulatorState(checkpoint.State):
    def __init__(self, sums: _Sums, name: str) -> None:
        super().__init__(name)
        self._sums = sums
        self._saved: dict[str, Any] = {"totals": {}}

    def sync(self) -> None:  # every replica: the collective is here, not in save (rank 0 only)
        self._saved = self._sums.state_dict()

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save(self._saved, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self._sums.load_state_dict(torch.load(fileobj, weights_only=True))

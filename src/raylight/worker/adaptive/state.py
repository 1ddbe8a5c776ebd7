"""Training state that survives restarts and resizes: epochs and metric accumulators."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import torch
import torch.distributed as dist


class Accumulator(MutableMapping[str, Any]):
    """Sums of metrics across replicas and across restarts.

    Add to it on every replica (``acc["correct"] += n``); read the totals of all
    replicas inside ``with acc.synchronized():``, which all-reduces what each replica
    added since the last synchronisation (a collective: call it on every rank).
    Outside, reads give what this replica added since then. Totals are part of every
    checkpoint, so they continue after a restart or a resize: ``ctx.accumulator()`` gives
    each the sums saved for the one made in the same epoch, in the same order
    (``Accumulators``), so a loop may make one before its epochs, or a new one each epoch.

    A one-element tensor may be added as it is (``acc["loss"] += loss.detach() * n``): the
    sum then stays a tensor on its device and is read back once, when it is synchronised,
    instead of a ``.item()`` (on a GPU, a wait for the device) at every step. Totals are
    numbers.
    """

    def __init__(self, *, world_size: int) -> None:
        self._world_size = world_size
        self._local: dict[str, Any] = {}  # a number, or a one-element tensor (its device's sum)
        self._totals: dict[str, float] = {}
        self._synced = False

    def __getitem__(self, key: str) -> Any:
        if self._synced:
            return self._totals.get(key, 0.0)
        return self._local.get(key, 0.0)

    def __setitem__(self, key: str, value: Any) -> None:
        if self._synced:
            raise RuntimeError("the accumulator is read-only inside synchronized()")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TypeError(
                    f"accumulator[{key!r}]: a sum is one number; got a tensor of shape {tuple(value.shape)} "
                    "(add value.sum() or value.mean())"
                )
            # float64 (MPS has none: float32) so a sum of many half-precision losses keeps its digits
            self._local[key] = value.detach().to(torch.float32 if value.device.type == "mps" else torch.float64)
        else:
            self._local[key] = float(value)

    def __delitem__(self, key: str) -> None:
        self._local.pop(key, None)
        self._totals.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._totals if self._synced else self._local)

    def __len__(self) -> int:
        return len(self._totals if self._synced else self._local)

    def _local_numbers(self, keys: list[str]) -> list[float]:
        """This replica's sums for ``keys`` as numbers: the tensors of each device read back
        in one copy."""
        values = [self._local.get(k, 0.0) for k in keys]
        by_device: dict[torch.device, list[int]] = {}
        for i, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                by_device.setdefault(value.device, []).append(i)
        for where in by_device.values():
            read = torch.stack([values[i].reshape(()).to(torch.float64) for i in where]).cpu().tolist()
            for i, number in zip(where, read, strict=True):
                values[i] = number
        return values

    def _sync(self) -> None:
        keys = sorted(self._local)
        if self._world_size > 1:
            gathered: list[Any] = [None] * self._world_size
            dist.all_gather_object(gathered, keys)
            keys = sorted({k for ks in gathered for k in ks})
        values = torch.tensor(self._local_numbers(keys), dtype=torch.float64)
        if self._world_size > 1 and keys:
            dist.all_reduce(values)
        for key, value in zip(keys, values.tolist(), strict=True):
            self._totals[key] = self._totals.get(key, 0.0) + value
        self._local.clear()

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[Accumulator]:
        self._sync()
        self._synced = True
        try:
            yield self
        finally:
            self._synced = False

    def reset(self) -> None:
        """Forget all totals (e.g. at the start of an epoch)."""
        self._local.clear()
        self._totals.clear()

    def state_dict(self) -> dict[str, Any]:
        self._sync()  # every rank's part is in the totals before they are saved
        return {"totals": dict(self._totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._totals = {k: float(v) for k, v in state["totals"].items()}
        self._local.clear()


class Accumulators:
    """A context's accumulators, each keyed by the epoch it was made in (None before the
    first) and its order among that epoch's, as AdaptDL keys its own.

    A restart re-runs the loop from the checkpoint's epoch: a loop that makes a new
    accumulator each epoch makes, in the resumed epoch, that epoch's first again, and it
    gets that epoch's saved sums. (Keyed by creation order since the start, it got the
    sums of the run's first accumulator: an epoch's "accuracy" became 1.66 after a
    restart.) An accumulator meant for the whole run belongs before the epoch loop.
    Checkpoints keep those made before the epochs and in the current one: earlier epochs
    do not run again after a restart from it.
    """

    def __init__(self, *, world_size: int, saved: list[dict[str, Any]]) -> None:
        self._world_size = world_size
        self._made: dict[tuple[int | None, int], Accumulator] = {}
        # A checkpoint of an earlier raylight saved a list in creation order, unkeyed.
        self._saved = {
            (entry["epoch"], entry["index"]) if "index" in entry else ("order", i): entry
            for i, entry in enumerate(saved)
        }
        self._count = 0  # made since the start: the key of an unkeyed saved entry

    def make(self, epoch: int | None) -> Accumulator:
        key = (epoch, sum(1 for e, _ in self._made if e == epoch))
        acc = Accumulator(world_size=self._world_size)
        saved = self._saved.get(key, self._saved.get(("order", self._count)))
        if saved is not None:
            acc.load_state_dict(saved)
        self._made[key] = acc
        self._count += 1
        return acc

    def state(self, epoch: int | None) -> list[dict[str, Any]]:
        """What a checkpoint at ``epoch`` keeps (each one synchronised: a collective)."""
        for key in [k for k in self._made if k[0] is not None and epoch is not None and k[0] < epoch]:
            del self._made[key]  # an earlier epoch's: never made again after a restart from here
        return [{"epoch": e, "index": i, **acc.state_dict()} for (e, i), acc in self._made.items()]

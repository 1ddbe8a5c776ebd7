"""A worker's checkpoints: writing what the loop reports (whole through rank 0, or
sharded by every rank into the run's storage), loading the one a (re)start resumes from,
and remembering what the loop's checkpoint holds, which a preemption's just-in-time
snapshot saves. ``TrainContext`` holds one ``WorkerCheckpoints``; raylight's own state in
a checkpoint (loaders, accumulators, epochs, the step sync) is the context's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from raylight.storage import sharded
from raylight.storage.checkpoint import RAYLIGHT_KEY, SHARDED, Checkpoint, serialize_state
from raylight.storage.run_dir import checkpoint_name
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.strategies import Strategy

CHECKPOINT_BEAT_S = 5.0  # how often a checkpoint being written or read counts as progress


class WorkerCheckpoints:
    """This worker's checkpoints: the one it (re)started from (``checkpoint``, its raylight
    state ``restored``), the index of the last it made (``commit``) and the entries of the
    loop's checkpoint (``entries``)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        strategy: Strategy,
        sink: Any,
        checkpoint: Checkpoint | None,
        checkpoint_dir: str | None,
        next_checkpoint: int | None,
        elastic: bool,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._strategy = strategy
        self._sink = sink
        self._elastic = elastic
        self.checkpoint = checkpoint
        self.restored = raylight_state(checkpoint)
        # Checkpoints are numbered as the driver commits them: from next_checkpoint (the
        # driver's next index) when it is given; sharded ones are written under that number.
        self.commit = int(self.restored.get("commit", -1)) if next_checkpoint is None else next_checkpoint - 1
        self._checkpoint_dir = checkpoint_dir
        # What a checkpoint of this loop holds (the entries of its last checkpoint, or the
        # objects it loads into): what a preemption's just-in-time checkpoint saves.
        self.entries: dict[str, Any] | None = None

    def save(
        self, checkpoint: dict[str, Any], collect: Callable[[], dict[str, Any]], *, seq: int
    ) -> tuple[bytes | None, int | None]:
        """Write ``checkpoint`` with raylight's own state (``collect()``, a collective):
        returns its bytes (rank 0's, and every rank's copy in an elastic run) and, when
        sharded, the index its shards were written under."""
        data = None
        sharded_index = None
        if not isinstance(checkpoint, dict):
            raise TypeError(
                f"a checkpoint must be a dict (e.g. {{'model': model, 'opt': opt}}), got "
                f"{type(checkpoint).__name__}"
            )
        if RAYLIGHT_KEY in checkpoint:
            raise ValueError(f"the checkpoint key {RAYLIGHT_KEY!r} is reserved for raylight")
        self.entries = dict(checkpoint)
        objects = objects_in(checkpoint)
        state = {**checkpoint, **self._strategy.objects_state(objects)} if objects else dict(checkpoint)
        own = collect()
        own["objects"] = {k: "module" if isinstance(v, nn.Module) else "optimizer" for k, v in objects.items()}
        self.commit = own["commit"]
        if self._strategy.checkpoint_format(self.world_size) == SHARDED:
            own["format"] = SHARDED
            state, tensors = sharded.split(state)
            with self.io():
                sharded.save(tensors, self._shard_dir(self.commit))  # a collective
            sharded_index = self.commit
        else:
            with self.io():
                state = self._strategy.full_state(state)  # a collective when sharded
        if self.rank == 0 or self._elastic:
            data = serialize_state({**state, RAYLIGHT_KEY: own})
            if self._elastic:
                self._sink.keep_commit(self.commit, data, seq)
        return data, sharded_index

    @contextlib.contextmanager
    def io(self) -> Iterator[None]:
        """A checkpoint's writing, reading or gathering counts as progress while it lasts:
        a side thread beats every ``CHECKPOINT_BEAT_S``, so a large model on slow storage
        is not declared hung after ``FailureConfig.hang_timeout_s``. Its collectives still
        fail after ``collective_timeout_s`` when a peer stops answering."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(CHECKPOINT_BEAT_S):
                self._sink.heartbeat()

        beating = threading.Thread(target=beat, name="raylight-checkpoint-io", daemon=True)
        beating.start()
        try:
            yield
        finally:
            stop.set()
            beating.join()
        self._sink.heartbeat()

    def _shard_dir(self, index: int) -> str:
        if self._checkpoint_dir is None:
            raise RuntimeError(
                f"strategy {self._strategy.name!r} writes sharded checkpoints into the run's "
                "storage, which this worker was not given"
            )
        return f"{self._checkpoint_dir.rstrip('/')}/{checkpoint_name(index)}"

    def load(self, objects: dict[str, Any] | None, *, unwrap: Callable[[nn.Module], nn.Module]) -> dict[str, Any] | None:
        """``TrainContext.load_checkpoint`` (``unwrap``: the user's module inside a prepared one)."""
        ckpt = self.checkpoint
        objects = dict(objects or {})
        if self.entries is None and objects:
            self.entries = dict(objects)
        if ckpt is None:
            return None
        stored = ckpt.full_state()
        entries = sorted(k for k in stored if k != RAYLIGHT_KEY)
        unknown = sorted(k for k in objects if k not in entries)
        if unknown:
            raise KeyError(f"the checkpoint has no {unknown}; its entries are {entries}")
        resolved = objects_in(objects)
        others = sorted(k for k in objects if k not in resolved)
        if others:
            raise TypeError(
                f"ctx.load_checkpoint loads into modules and optimizers; {others} are not. "
                "Take plain values from what it returns instead"
            )
        saved_objects = stored.get(RAYLIGHT_KEY, {}).get("objects", {})
        as_saved = {k: v for k, v in resolved.items() if k in saved_objects}
        raw = {k: v for k, v in resolved.items() if k not in saved_objects}
        rest = [k for k in entries if k not in objects]
        if ckpt.sharded:
            path = ckpt._shard_path()
            with self.io():
                if as_saved:
                    self._load_shards(as_saved, {k: stored[k] for k in as_saved}, path)
                full = sharded.load_full({k: stored[k] for k in (*raw, *rest)}, path)
        else:
            full = ckpt.load()
            if as_saved:
                self._strategy.load_objects(as_saved, {k: full[k] for k in as_saved}, full=True)
        for key, obj in raw.items():  # a state dict reported as such: loaded whole
            target = unwrap(obj) if isinstance(obj, nn.Module) else obj
            target.load_state_dict(full[key])
        self._sink.heartbeat()
        if self.entries is not None and set(self.entries) == set(objects):
            self.entries.update({k: full[k] for k in rest})
        return {k: full[k] for k in rest}

    def _load_shards(self, objects: dict[str, Any], stored: dict[str, Any], path: str) -> None:
        """Read into ``objects`` the shards this rank holds now (DCP reshards)."""
        _, template = sharded.split(self._strategy.objects_state(objects))
        wanted = set(sharded.tensor_keys(stored))
        if set(template) != wanted:
            only_ckpt, only_here = sorted(wanted - set(template)), sorted(set(template) - wanted)
            raise ValueError(
                f"checkpoint entries {sorted(objects)} do not match the objects given: "
                f"only in the checkpoint: {only_ckpt[:5]}{' ...' if len(only_ckpt) > 5 else ''}; "
                f"only in the objects: {only_here[:5]}{' ...' if len(only_here) > 5 else ''}"
            )
        sharded.load_into(template, path, collective=self.world_size > 1)
        self._strategy.load_objects(objects, sharded.join(stored, template), full=False)


def objects_in(state: dict[str, Any]) -> dict[str, Any]:
    """The modules and optimizers among ``state``'s values (prepared optimizers seen
    through to the user's)."""
    found: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, AdaptiveOptimizer):
            value = value.optimizer
        if isinstance(value, nn.Module | torch.optim.Optimizer):
            found[key] = value
    return found


def raylight_state(checkpoint: Checkpoint | None) -> dict[str, Any]:
    if checkpoint is None:
        return {}
    state = checkpoint.full_state().get(RAYLIGHT_KEY)
    return state if isinstance(state, dict) else {}

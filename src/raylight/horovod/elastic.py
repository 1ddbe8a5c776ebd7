"""``hvd.elastic``: Horovod's commit / restore / sync state and the retrying ``run``.

As in Horovod: ``state.commit()`` keeps an in-memory copy of the state (and checks for
host changes), ``state.restore()`` goes back to it, ``state.sync()`` gives every rank rank
0's, and ``@hvd.elastic.run`` calls the training function again after a
``HorovodInternalError`` (restore, reset the group, the reset callbacks, sync) or a
``HostsUpdatedInterrupt`` (reset, callbacks, sync unless ``skip_sync``).

Two differences, because raylight's engine, not this process, owns restarts:

- Reset re-forms a group this module formed (``hvd.init()`` from a launcher's
  environment) with the same launcher environment: every rank must still be alive. A
  group ``hvd.init()`` adopted (inside ``raylight.fit`` or a Lightning strategy) is not
  re-formed here: the error propagates and raylight's failure policy restarts the group.
- Under ``raylight run`` (a run context exists) ``commit()`` also reports the state as
  the run's checkpoint, and the first ``sync()`` of a process loads the run's last
  checkpoint into the state before broadcasting, so a group that raylight restarted
  (possibly at another size, ``raylight run -n MIN:MAX``) resumes from the last commit.
  What is persisted: the model's and optimizer's ``state_dict``, the tensors and the
  plain values given to ``TorchState(**kwargs)``, and the commit count, under the
  checkpoint key ``"horovod_elastic"``.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from raylight.worker.hvd import basics
from raylight.worker.hvd.basics import HorovodInternalError, HostsUpdatedInterrupt
from raylight.worker.hvd.ops import allgather_object, broadcast_object
from raylight.worker.hvd.optimizer import broadcast_optimizer_state, broadcast_parameters

CHECKPOINT_KEY = "horovod_elastic"

__all__ = [
    "ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run",
]


def _run_context() -> Any:
    """``raylight run``'s context (``report(metrics, checkpoint=)``, ``load_checkpoint()``),
    or None outside ``raylight run``."""
    from raylight.worker.run_channel import run_context

    try:
        return run_context()
    except RuntimeError:  # not under raylight run
        return None


class State:
    """What a training function needs to resume: ``save``/``restore``/``sync`` are the
    subclass's; ``commit``, reset callbacks and host checks are common."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0
        self._loaded = False  # the run's checkpoint was read (once per process)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Call ``callbacks`` after every reset (e.g. to scale the LR to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep a copy of the state to restore after a failure (and, under ``raylight
        run``, make it the run's checkpoint); then check for host changes."""
        self.save()
        self._commits += 1
        ctx = _run_context()
        if ctx is not None:
            ctx.report({"horovod_commits": self._commits}, checkpoint={CHECKPOINT_KEY: self._payload()})
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises ``HostsUpdatedInterrupt`` here when its driver saw hosts come or
        go. raylight resizes by restarting the group (which resumes from the last commit),
        so there is nothing to check in the process."""

    def _resume(self) -> None:
        """Before the first sync: the run's last checkpoint, when ``raylight run`` has one."""
        if self._loaded:
            return
        self._loaded = True
        ctx = _run_context()
        stored = ctx.load_checkpoint() if ctx is not None else None
        if isinstance(stored, dict) and CHECKPOINT_KEY in stored:
            self._load_payload(stored[CHECKPOINT_KEY])
            self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def _payload(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_payload(self, payload: dict[str, Any]) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain values given as keyword arguments, read and written as attributes
    (``state.epoch += 1``); synced by broadcasting them from rank 0."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._object_names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self.save()

    def _objects(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._object_names}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._objects())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        self._resume()
        if self._object_names:
            for name, value in broadcast_object(self._objects(), 0).items():
                setattr(self, name, value)

    def _payload(self) -> dict[str, Any]:
        return {"objects": copy.deepcopy(self._saved), "commits": self._commits}

    def _load_payload(self, payload: dict[str, Any]) -> None:
        for name, value in payload.get("objects", {}).items():
            if name in self._object_names:
                setattr(self, name, value)
        self._commits = int(payload.get("commits", 0))


class TorchState(ObjectState):
    """A model, an optimizer, tensors and plain values (``TorchState(model=m,
    optimizer=opt, epoch=0, batch=0)``)."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self._tensor_names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        self._sampler_names = [k for k, v in kwargs.items() if isinstance(v, ElasticSampler)]
        self._saved_samplers: dict[str, dict[str, Any]] = {}
        self._saved_model: dict[str, Any] | None = None
        self._saved_optimizer: dict[str, Any] | None = None
        self._saved_tensors: dict[str, torch.Tensor] = {}
        for name in (*self._tensor_names, *self._sampler_names):
            setattr(self, name, kwargs[name])
        special = {*self._tensor_names, *self._sampler_names}
        super().__init__(**{k: v for k, v in kwargs.items() if k not in special})  # saves

    def save(self) -> None:
        super().save()
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_tensors = {n: getattr(self, n).detach().clone() for n in self._tensor_names}
        self._saved_samplers = {n: copy.deepcopy(getattr(self, n).state_dict()) for n in self._sampler_names}

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, value in self._saved_tensors.items():
            getattr(self, name).data.copy_(value)
        for name, sampler_state in self._saved_samplers.items():
            getattr(self, name).load_state_dict(copy.deepcopy(sampler_state))

    def sync(self) -> None:
        super().sync()  # the run's checkpoint first, then the plain values
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        if self._tensor_names:
            broadcast_parameters({n: getattr(self, n) for n in self._tensor_names}, root_rank=0)
        for name in self._sampler_names:
            sampler = getattr(self, name)
            # Every rank's processed samples count, then rank 0's epoch (as Horovod's).
            merged = sampler.state_dict()
            merged["processed_indices"] = set().union(*allgather_object(sampler.processed_indices))
            sampler.load_state_dict(broadcast_object(merged, 0))

    def _payload(self) -> dict[str, Any]:
        payload = super()._payload()
        payload.update(model=self._saved_model, optimizer=self._saved_optimizer, tensors=dict(self._saved_tensors),
                       samplers=copy.deepcopy(self._saved_samplers))
        return payload

    def _load_payload(self, payload: dict[str, Any]) -> None:
        super()._load_payload(payload)
        if self.model is not None and payload.get("model") is not None:
            self.model.load_state_dict(payload["model"])
        if self.optimizer is not None and payload.get("optimizer") is not None:
            self.optimizer.load_state_dict(payload["optimizer"])
        for name, value in (payload.get("tensors") or {}).items():
            if name in self._tensor_names:
                getattr(self, name).data.copy_(value)
        for name, sampler_state in (payload.get("samplers") or {}).items():
            if name in self._sampler_names:
                getattr(self, name).load_state_dict(sampler_state)


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's elastic sampler: shards the samples this epoch has not processed yet
    among the current ranks (again after every reset), so an epoch interrupted by a
    resize goes on where it stopped. Record progress with ``record_batch`` or
    ``record_indices``; give it to ``TorchState`` to have it saved, restored and synced."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        start = batch_idx * batch_size
        return self.indices[start : min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-shard the unprocessed samples among the ranks there are now."""
        self.num_replicas, self.rank = basics.size(), basics.rank()
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Any:
        order = list(self.remaining_indices)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        order += order[: self.total_size - len(order)]  # pad to divide evenly, as DistributedSampler
        self.indices = order[self.rank : self.total_size : self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


def _reset() -> None:
    """Re-form the group after a failure (see the module docstring)."""
    owned = basics._state is not None and basics._state.owns_group
    basics.shutdown()
    if not owned:
        raise HorovodInternalError(
            "hvd.elastic.run: the process group belongs to raylight (hvd.init() adopted it), which "
            "restarts the group from the run's last checkpoint; it is not re-formed in the process"
        )
    basics.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)``: it is called again, from the last commit, after
    a collective fails, and after the hosts change."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            _reset()
            state.on_reset()

    return wrapper

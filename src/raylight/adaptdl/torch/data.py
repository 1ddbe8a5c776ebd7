"""``adaptdl.torch.AdaptiveDataLoader``: a loader whose ``batch_size`` is the global batch
(every replica's samples of one optimizer step together, as raylight's loader), split
over the replicas; with ``autoscale_batch_size`` the batch (and the micro-steps of
gradient accumulation) follow raylight's adaptive engine (``_adapt``).

Each epoch's order is the same on every replica (a permutation seeded by the epoch), and
each micro-step takes the next ``replicas x local batch`` samples of it, every replica
its own slice, so that all replicas make the same number of steps. Where it is in the
epoch is part of the checkpoint: a restarted run continues the epoch where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import IO, Any

import torch
from torch.utils.data import Dataset, Sampler, default_collate

from raylight.adaptdl import checkpoint, env
from raylight.adaptdl.torch._adapt import Adapter
from raylight.adaptdl.torch.epoch import current_epoch
from raylight.adaptive.noise import NoiseScaleEstimator

_CURRENT: list[AdaptiveDataLoader] = []  # the loader being iterated (current_dataloader())
_COUNT = [0]


def current_dataloader() -> AdaptiveDataLoader | None:
    """The AdaptiveDataLoader being iterated now, or None."""
    return _CURRENT[-1] if _CURRENT else None


class ElasticSampler(Sampler[int]):
    """This replica's share of ``dataset``, in an order seeded by the epoch (``set_epoch``)."""

    def __init__(self, dataset: Any, shuffle: bool = True) -> None:
        self.dataset, self.shuffle, self.epoch, self.index = dataset, shuffle, 0, 0

    def _order(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.epoch)).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()[self.index:]
        return iter(order[env.replica_rank()::env.num_replicas()])

    def __len__(self) -> int:
        return len(range(env.replica_rank(), len(self.dataset) - self.index, env.num_replicas()))

    def set_epoch(self, epoch: int, index: int = 0) -> None:
        self.epoch, self.index = epoch, index


class _Position(checkpoint.State):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.epoch: int | None = None
        self.index = 0  # samples of the epoch done, all replicas together

    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({"epoch": self.epoch, "index": self.index}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        saved = torch.load(fileobj, weights_only=True)
        self.epoch, self.index = saved["epoch"], int(saved["index"])


class AdaptiveDataLoader:
    """AdaptDL's loader (``batch_size``: the global batch). Of the other ``DataLoader``
    arguments, ``collate_fn`` is used; the rest (``num_workers``, ``pin_memory``, ...) are
    accepted and samples are read in the script's process; ``sampler`` and
    ``batch_sampler`` are refused (this loader orders and splits the data itself)."""

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 **kwargs: Any) -> None:
        for key in ("sampler", "batch_sampler"):
            if kwargs.get(key) is not None:
                raise ValueError(f"AdaptiveDataLoader({key}=...): it orders and splits the data itself; "
                                 "drop the argument (shuffle=True gives a new order each epoch)")
        if batch_size < 1:
            raise ValueError(f"AdaptiveDataLoader(batch_size={batch_size}): the global batch size must be >= 1")
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self._kwargs = kwargs
        name = f"adaptdl-dataloader-{_COUNT[0]}"
        _COUNT[0] += 1
        self._position = _Position(name)
        self._adapter = Adapter(f"{name}-batch", batch_size)
        checkpoint.load_state(self._position)
        checkpoint.load_state(self._adapter)
        self.training = False  # a backward pass ran inside this loader
        self._micro = 0  # micro-step within the optimizer step
        self._micro_count = 1  # micro-steps of this optimizer step
        self._epoch_runs = 0  # iterations outside remaining_epochs_until
        self.noise: NoiseScaleEstimator | None = None  # AdaptiveDataParallel's, once it trained in this loader
        self._collate = kwargs.get("collate_fn") or default_collate

    # -- AdaptDL's interface ---------------------------------------------------------------
    def autoscale_batch_size(self, max_batch_size: int, local_bsz_bounds: tuple[int, int] | None = None,
                             gradient_accumulation: bool = False) -> None:
        """Let the global batch grow up to ``max_batch_size`` (each replica's micro-batch
        within ``local_bsz_bounds``, more micro-steps per step with ``gradient_accumulation``)."""
        self._adapter.autoscale(max_batch_size, None if local_bsz_bounds is None else (int(local_bsz_bounds[0]), int(local_bsz_bounds[1])),
                                gradient_accumulation)

    @property
    def current_local_bsz(self) -> int:
        return self._adapter.plan.atomic_bsz

    @property
    def accumulation_steps(self) -> int:
        """Extra micro-steps per optimizer step (0: none)."""
        return self._adapter.plan.accum_steps

    @property
    def current_batch_size(self) -> int:
        """The global batch of an optimizer step now: replicas x local batch x micro-steps."""
        return self._adapter.plan.global_batch(env.num_replicas())

    @property
    def max_batch_size(self) -> int | None:
        return self._adapter.max_batch_size

    @property
    def local_bsz_bounds(self) -> tuple[int, int] | None:
        return self._adapter.bounds

    def is_accum_step(self) -> bool:
        return self._micro < self._micro_count - 1

    def is_optim_step(self) -> bool:
        return not self.is_accum_step()

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        """Write the batch sizes to a TensorBoard ``SummaryWriter``."""
        if tag_prefix and not tag_prefix.endswith("/"):
            tag_prefix += "/"
        writer.add_scalar(tag_prefix + "Total_Batch_Size", self.current_batch_size, global_step)
        writer.add_scalar(tag_prefix + "Local_Batch_Size", self.current_local_bsz, global_step)
        writer.add_scalar(tag_prefix + "Accumulation_Steps", self.accumulation_steps, global_step)

    def __len__(self) -> int:
        """Micro-batches per epoch at the current batch size."""
        per = env.num_replicas() * self.current_local_bsz
        n = len(self.dataset)  # type: ignore[arg-type]
        return n // per if self.drop_last else -(-n // per)

    # -- iteration -------------------------------------------------------------------------
    def _epoch(self) -> int:
        epoch = current_epoch()
        if epoch is None:
            epoch = self._epoch_runs
            self._epoch_runs += 1
        return epoch

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch()
        n, replicas = len(self.dataset), env.num_replicas()  # type: ignore[arg-type]
        pos = self._position
        if pos.epoch != epoch:
            pos.epoch, pos.index = epoch, 0
        sampler = ElasticSampler(self.dataset, self.shuffle)
        sampler.set_epoch(epoch)
        order = sampler._order()
        _CURRENT.append(self)
        try:
            while pos.index < n:
                plan = self._adapter.plan
                per_micro = replicas * plan.atomic_bsz
                left = n - pos.index
                full = left // per_micro
                if full == 0 and (self.drop_last or (self.training and left < replicas)):
                    break
                self._micro_count = max(1, min(plan.accum_steps + 1, full))
                for micro in range(self._micro_count):
                    self._micro = micro
                    chunk = order[pos.index:pos.index + per_micro]
                    mine = chunk[env.replica_rank()::replicas]
                    pos.index += len(chunk)
                    if not mine:
                        continue
                    batch = self._collate([self.dataset[i] for i in mine])
                    start = time.perf_counter()
                    yield batch
                    if self.training:
                        self._adapter.record(time.perf_counter() - start, optim=self.is_optim_step())
                if self.training:
                    self._adapter.after_step(self.noise, n)
            pos.epoch, pos.index = epoch + 1, 0
        finally:
            _CURRENT.remove(self)
            self._micro, self._micro_count = 0, 1

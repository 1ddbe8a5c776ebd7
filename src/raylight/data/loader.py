"""Sharding a map-style dataset across workers by global batch.

``batch_size`` is the *global* batch: every step consumes the next ``batch_size``
samples of the epoch's order, and rank ``r`` of ``K`` takes the ``r``-th contiguous
slice of it. With DDP's gradient averaging, K workers then compute exactly the
gradient one process would compute on the same global batch, whatever K is. The
order of an epoch is ``torch.randperm(n)`` seeded with ``seed + epoch`` (or
``arange(n)`` without shuffling), the same on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

log = logging.getLogger("raylight")


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's indices of each global batch of one epoch."""

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_samples <= 0:
            raise ValueError("the dataset is empty: prepare_loader needs at least one sample")
        if batch_size < world_size:
            raise ValueError(
                f"batch_size={batch_size} is the global batch and must be at least the "
                f"number of workers ({world_size}); raise batch_size or use fewer workers"
            )
        self.num_samples = num_samples
        self.local_batch_size = batch_size // world_size
        self.global_batch_size = self.local_batch_size * world_size
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=gen)

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        gbs, k, r = self.global_batch_size, self.world_size, self.rank
        for start in range(0, self.num_samples, gbs):
            batch = order[start : start + gbs]
            if len(batch) == gbs:
                part = batch[r * self.local_batch_size : (r + 1) * self.local_batch_size]
            elif self.drop_last:
                return
            else:
                # Split the tail as evenly as possible; a rank left with nothing repeats
                # the epoch's first sample so every rank takes the same number of steps.
                base, extra = divmod(len(batch), k)
                lo = r * base + min(r, extra)
                part = batch[lo : lo + base + (1 if r < extra else 0)]
                if len(part) == 0:
                    part = order[:1]
            yield part.tolist()


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a nested batch (tuples, lists, dicts) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, Mapping):
        return type(batch)({k: move_to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(v, device) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def _batch_len(batch: Any, default: int) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else default
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            n = _batch_len(item, -1)
            if n >= 0:
                return n
    return default


class PreparedLoader:
    """An iterable over this worker's batches, moved to its device.

    Each full pass is one epoch; the epoch advances by itself after a pass, or is set
    explicitly with ``set_epoch`` (for example after restoring a checkpoint).
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        sampler: GlobalBatchSampler,
        device: torch.device,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        on_batch: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        self.sampler = sampler
        self.device = device
        self._on_batch = on_batch
        self._next_epoch = 0
        self._loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
        )

    @property
    def batch_size(self) -> int:
        """The global batch size (all workers together)."""
        return self.sampler.global_batch_size

    @property
    def local_batch_size(self) -> int:
        return self.sampler.local_batch_size

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch
        self.sampler.set_epoch(epoch)
        steps = len(self.sampler)
        for step, batch in enumerate(self._loader):
            if self._on_batch is not None:
                self._on_batch(epoch, step, steps, _batch_len(batch, self.local_batch_size))
            yield move_to_device(batch, self.device)
        self._next_epoch = epoch + 1


def prepare_loader(
    data: Dataset | DataLoader,
    *,
    batch_size: int | None,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    rank: int,
    world_size: int,
    device: torch.device,
    on_batch: Callable[[int, int, int, int], None] | None,
) -> PreparedLoader:
    collate_fn = None
    num_workers = 0
    pin_memory = False
    if isinstance(data, DataLoader):
        dataset = data.dataset
        collate_fn = data.collate_fn
        num_workers = data.num_workers
        pin_memory = data.pin_memory
        if batch_size is None:
            batch_size = data.batch_size
    else:
        dataset = data
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            "prepare_loader needs a map-style dataset (with __len__ and __getitem__); "
            f"got the IterableDataset {type(dataset).__name__}"
        )
    if not hasattr(dataset, "__len__"):
        raise TypeError(f"prepare_loader needs a dataset with __len__, got {type(dataset).__name__}")
    if batch_size is None or batch_size < 1:
        raise ValueError(f"prepare_loader needs batch_size >= 1 (the global batch), got {batch_size}")
    if batch_size % world_size:
        log.warning(
            "batch_size=%d is not divisible by %d workers; using a global batch of %d",
            batch_size,
            world_size,
            (batch_size // world_size) * world_size,
        )
    sampler = GlobalBatchSampler(
        len(dataset),
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    return PreparedLoader(
        dataset,
        sampler=sampler,
        device=device,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory,
        on_batch=on_batch,
    )

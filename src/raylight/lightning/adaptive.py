"""Adaptive batch size and learning rate for Lightning, on raylight's adaptive engine.

With ``RayStrategy(adaptive=AdaptiveConfig(...))`` the driver runs raylight's
AdaptiveEngine (goodput model, batch-size policy) exactly as for ``raylight.fit``; on the
workers, Lightning's own loop is driven through public hooks instead of raylight's
ElasticLoader (whose look-ahead would not line up with Lightning's prefetching):

- the training DataLoader gets a batch sampler that reads the current plan's per-worker
  batch size at every batch (``PlanBatchSampler``), over Lightning's DistributedSampler;
- the optimizer is wrapped by ``ctx.prepare_optimizer`` (raylight's AdaptiveOptimizer):
  the LR rule's factor on each step, gradient-noise measurement;
- ``AdaptiveSteps`` (a callback) starts each optimizer step on the StepSync (the ranks
  agree on the plan every ``control_interval_steps``), times it for the throughput
  model, runs measuring steps under DDP's ``no_sync`` so the optimizer sees local and
  averaged gradients, and logs ``adaptive/batch_size`` and ``adaptive/lr_factor``.

Gradient accumulation is not adapted here (Lightning's ``accumulate_grad_batches`` owns
it), so ``AdaptiveConfig.accumulation`` is turned off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Sampler

from raylight.adaptive.plan import BatchPlan
from raylight.base.exceptions import ConfigError
from raylight.config import AdaptiveConfig


def lightning_adaptive(config: AdaptiveConfig | None) -> AdaptiveConfig | None:
    """``config`` without accumulation; an explicit ``accumulation=True`` is an error."""
    if config is None:
        return None
    if config.accumulation and "accumulation" in config.model_fields_set:
        raise ConfigError(
            "RayStrategy(adaptive=AdaptiveConfig(accumulation=True)) is not supported: "
            "Lightning owns gradient accumulation (Trainer(accumulate_grad_batches=...)); "
            "drop accumulation=True"
        )
    return config.model_copy(update={"accumulation": False})


class PlanBatchSampler(Sampler[list[int]]):
    """Batches of ``sync.plan.atomic_bsz`` indices from ``sampler``, the size read as each
    batch is made, so a new plan takes effect at the next batch.

    It has no ``__len__`` on purpose: the number of batches in an epoch changes with the
    plan, and Lightning, given no length, ends the epoch (and validates) when the data
    runs out rather than after a batch count fixed at the start.
    """

    def __init__(self, sampler: Any, sync: Any, *, drop_last: bool = False) -> None:
        self.sampler = sampler  # Lightning calls sampler.set_epoch through this attribute
        self.sync = sync
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.sampler)
        while True:
            size = self.sync.plan.atomic_bsz
            batch = [i for _, i in zip(range(size), it, strict=False)]
            if not batch or (self.drop_last and len(batch) < size):
                return
            yield batch



def adapt_train_loader(loader: DataLoader, sync: Any, world_size: int) -> DataLoader:
    """The training loader with a plan-following batch size; the plan starts at the
    loader's batch size (per worker, as Lightning's DataLoaders are)."""
    if loader.batch_size is None:
        raise ConfigError(
            "RayStrategy(adaptive=...) needs a training DataLoader built with batch_size= "
            "(not a custom batch_sampler): raylight adapts that batch size"
        )
    sync.init_batch_size = loader.batch_size * world_size
    sync.plan = BatchPlan(loader.batch_size, 0, sync.plan.version)
    sync.ready = True
    return DataLoader(
        loader.dataset,
        batch_sampler=PlanBatchSampler(loader.sampler, sync, drop_last=loader.drop_last),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
    )


def _batch_len(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            if (n := _batch_len(item)) is not None:
                return n
    return None


class AdaptiveSteps(Callback):
    """Drives raylight's StepSync from Lightning's training loop (one batch = one step)."""

    def __init__(self, sync: Any, strategy: Any) -> None:
        self.sync = sync
        self.strategy = strategy
        self._unsynced = contextlib.ExitStack()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        sync = self.sync
        plan = sync.begin_step()  # a collective on control steps: every rank calls it
        sync.micro, sync.micro_steps = 0, 1
        # A batch made before a plan change has the old size: neither timed nor measured.
        sync.uniform_step = _batch_len(batch) == plan.atomic_bsz
        sync.tick(sync_step=True)
        model = self.strategy.model
        if sync.measuring and sync.world_size > 1 and hasattr(model, "no_sync"):
            # The optimizer all-reduces this step's gradients itself, measuring both sides.
            self._unsynced.enter_context(model.no_sync())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._unsynced.close()
        sync = self.sync
        pl_module.log("adaptive/batch_size", float(sync.plan.global_batch(sync.world_size)), rank_zero_only=True)
        pl_module.log("adaptive/lr_factor", float(sync.lr_factor()), rank_zero_only=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.sync.pause_clock()  # validation and epoch ends are not steps

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.sync.pause_clock()

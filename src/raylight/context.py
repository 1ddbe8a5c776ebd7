"""TrainContext: the one per-worker object a training loop talks to.

It knows this worker's place in the group (rank, world size, device), prepares the
model and data for data-parallel training, and carries reports and checkpoints to the
driver. It holds no global state: everything a worker needs is on this object.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from raylight._time import wall
from raylight.checkpoint import Checkpoint, serialize_state
from raylight.data.loader import PreparedLoader, prepare_loader
from raylight.strategies import DDPStrategy
from raylight.worker_group.protocol import Report

ReduceOp = Literal["mean", "sum", "max", "min"]


class ReportSink(Protocol):
    """Where a context sends what it learns; the worker actor or the in-process runner."""

    def report(self, report: Report) -> None: ...

    def progress(self, epoch: int, step: int, steps_per_epoch: int, samples: int) -> None: ...

    def heartbeat(self) -> None: ...


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def _make_logger(rank: int) -> logging.Logger:
    logger = logging.getLogger(f"raylight.worker.rank{rank}")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(message)s"))
        handler.addFilter(_RankFilter(rank))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _plain_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as JSON-able Python values (tensors and numpy scalars become numbers)."""
    if not isinstance(metrics, dict):
        raise TypeError(f"ctx.report needs a dict of metrics, got {type(metrics).__name__}")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be strings, got {key!r}")
        if isinstance(value, torch.Tensor):
            value = value.item() if value.numel() == 1 else value.tolist()
        elif isinstance(value, numbers.Number) and not isinstance(value, bool | int | float):
            value = value.item() if hasattr(value, "item") else float(value)  # type: ignore[arg-type]
        out[key] = value
    return out


class TrainContext:
    """Per-worker handle passed to the training loop as its first argument.

    Attributes:
        rank: global rank of this worker, 0 .. world_size - 1.
        local_rank: rank among the workers on this node.
        world_size: number of workers.
        local_world_size: number of workers on this node.
        node_rank: index of this worker's node among the group's nodes.
        device: the torch device this worker trains on.
        config: the ``config`` dict given to ``fit``.
        logger: a logger whose lines are prefixed with this worker's rank.
    """

    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        local_world_size: int,
        node_rank: int,
        device: torch.device,
        sink: ReportSink,
        checkpoint: Checkpoint | None = None,
        config: dict[str, Any] | None = None,
        strategy: DDPStrategy | None = None,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.node_rank = node_rank
        self.device = device
        self.config = dict(config or {})
        self.logger = _make_logger(rank)
        self._sink = sink
        self._checkpoint = checkpoint
        self._strategy = strategy or DDPStrategy()

    # -- model and data ------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to this worker's device and wrap it for data parallelism."""
        return self._strategy.wrap_model(model, device=self.device, world_size=self.world_size)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``prepare_model`` wrapped it in."""
        return self._strategy.unwrap_model(model)

    def prepare_loader(
        self,
        data: Dataset | DataLoader,
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> PreparedLoader:
        """Shard a map-style dataset (or a DataLoader's dataset) across the workers.

        ``batch_size`` is the *global* batch size; each worker loads
        ``batch_size // world_size`` samples per step. With a DataLoader, its
        ``batch_size``, ``collate_fn`` and ``num_workers`` are used unless overridden.
        """
        return prepare_loader(
            data,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            on_batch=self._sink.progress,
        )

    # -- reporting and checkpoints -------------------------------------------------
    def report(self, metrics: dict[str, Any], *, checkpoint: dict[str, Any] | None = None) -> None:
        """Report metrics, and optionally commit ``checkpoint`` (a state dict).

        Call it on every rank; the driver records rank 0's metrics and commits rank 0's
        checkpoint. The state is serialised here, so later changes to the tensors do
        not affect the checkpoint.
        """
        plain = _plain_metrics(metrics)
        self._sink.heartbeat()
        if self.rank != 0:
            return
        data = serialize_state(checkpoint) if checkpoint is not None else None
        self._sink.report(Report(metrics=plain, checkpoint=data, time=wall()))

    def get_checkpoint(self) -> Checkpoint | None:
        """The last committed checkpoint when this run (re)started, else None."""
        return self._checkpoint

    def heartbeat(self) -> None:
        """Tell the driver this worker is alive; call it inside very long steps."""
        self._sink.heartbeat()

    # -- collectives ---------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reaches this point."""
        if self.world_size > 1:
            dist.barrier()
        self._sink.heartbeat()

    def all_reduce(self, value: Any, op: ReduceOp = "mean") -> Any:
        """Reduce a number or tensor across workers; returns the same kind it was given."""
        if op not in ("mean", "sum", "max", "min"):
            raise ValueError(f"op must be one of mean, sum, max, min; got {op!r}")
        is_tensor = isinstance(value, torch.Tensor)
        tensor = value.detach().clone() if is_tensor else torch.tensor(float(value), dtype=torch.float64)
        if self.world_size > 1:
            tensor = tensor.to(self.device)
            reduce_op = {
                "mean": dist.ReduceOp.SUM,
                "sum": dist.ReduceOp.SUM,
                "max": dist.ReduceOp.MAX,
                "min": dist.ReduceOp.MIN,
            }[op]
            dist.all_reduce(tensor, op=reduce_op)
            if op == "mean":
                tensor = tensor / self.world_size
        self._sink.heartbeat()
        if is_tensor:
            return tensor.to(value.device)
        return tensor.item()

    def __repr__(self) -> str:
        return f"TrainContext(rank={self.rank}, world_size={self.world_size}, device={self.device})"


TrainLoop = Callable[..., Any]

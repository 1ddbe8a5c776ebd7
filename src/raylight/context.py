"""TrainContext: the one per-worker object a training loop talks to.

It knows this worker's place in the group (rank, world size, device), prepares the
model and data for data-parallel training, and carries reports and checkpoints to the
driver. It holds no global state: everything a worker needs is on this object.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import numbers
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from raylight._time import wall
from raylight.adaptive.plan import AdaptiveSpec, BatchPlan
from raylight.adaptive_worker.optimizer import AdaptiveOptimizer
from raylight.adaptive_worker.state import Accumulator
from raylight.adaptive_worker.sync import ResizeInterrupt, StepSync
from raylight.checkpoint import RAYLIGHT_KEY, Checkpoint, serialize_state
from raylight.data.loader import ElasticLoader, prepare_loader
from raylight.strategies import DDPStrategy, Strategy
from raylight.worker_group.protocol import Report

ReduceOp = Literal["mean", "sum", "max", "min"]


class ReportSink(Protocol):
    """Where a context sends what it learns; the worker actor or the in-process runner."""

    def report(self, report: Report) -> None: ...

    def progress(self, epoch: int, step: int, steps_per_epoch: int, samples: int) -> None: ...

    def heartbeat(self) -> None: ...

    def keep_commit(self, index: int, data: bytes, seq: int) -> None:
        """Hold this rank's copy of checkpoint ``index`` (made at report ``seq``) in
        memory (elastic runs)."""


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
        strategy: Strategy | None = None,
        adaptive: AdaptiveSpec | None = None,
        elastic: bool = False,
        threads: int = 1,
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
        self._elastic = elastic
        self._restored = _raylight_state(checkpoint)
        self._commit = int(self._restored.get("commit", -1))
        self._seq = int(self._restored.get("seq", -1))  # of the last report
        self._loaders: list[ElasticLoader] = []
        self._accumulators: list[Accumulator] = []
        self._models: list[nn.Module] = []
        self._optimizer: AdaptiveOptimizer | None = None
        self._epoch: int | None = None
        self._plan_given = adaptive is not None and adaptive.plan is not None
        self.sync: StepSync | None = None
        if adaptive is not None or elastic:
            if adaptive is None:
                raise ValueError("an elastic worker needs the run's AdaptiveSpec (the driver sends it)")
            spec = adaptive
            self.sync = StepSync(
                rank=rank,
                world_size=world_size,
                num_nodes=spec.num_nodes,
                threads=threads,
                plan=spec.plan or BatchPlan(1),
                init_batch_size=1,
                adaptive=spec.adaptive,
                lr_rule=spec.lr_rule,  # type: ignore[arg-type]
                lr_warmup_steps=spec.lr_warmup_steps,
                noise_smoothing=spec.noise_smoothing,
                every=spec.control_interval_steps,
                device=device,
            )
            if "sync" in self._restored:
                self.sync.load_state_dict(self._restored["sync"])

    # -- model, optimizer and data ---------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to this worker's device and wrap it for data parallelism: a DDP
        replica, or sharded in place with ``strategy="fsdp"`` (call it before building the
        optimizer, which must see the sharded parameters)."""
        wrapped = self._strategy.wrap_model(model, device=self.device, world_size=self.world_size)
        self._models.append(wrapped)
        return wrapped

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``prepare_model`` wrapped it in."""
        return self._strategy.unwrap_model(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Prepare ``optimizer`` for the strategy (with FSDP, a full optimizer state dict
        loads into it sharded) and for adaptive training: gradient accumulation, the LR
        rule (applied to each step's rate explicitly and restored after it) and
        gradient-noise measurement. Without ``fit(adaptive=...)`` the same optimizer is
        returned."""
        optimizer = self._strategy.wrap_optimizer(optimizer)
        if self.sync is None or not self.sync.adaptive:
            return optimizer
        self._optimizer = AdaptiveOptimizer(optimizer, sync=self.sync)
        return self._optimizer  # type: ignore[return-value]

    def prepare_loader(
        self,
        data: Dataset | DataLoader,
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        adaptive: bool = False,
    ) -> ElasticLoader:
        """Shard a map-style dataset (or a DataLoader's dataset) across the workers.

        ``batch_size`` is the *global* batch size; each worker loads
        ``batch_size // world_size`` samples per step. With a DataLoader, its
        ``batch_size``, ``collate_fn`` and ``num_workers`` are used unless overridden.
        ``adaptive=True`` marks the training loader: its batch size follows the adaptive
        plan (with ``fit(adaptive=...)``) and an elastic run resizes at its step
        boundaries. Loader positions (epoch and sample) are saved in every checkpoint.
        """
        sync = None
        if adaptive:
            if self.sync is None:
                self.logger.warning(
                    "prepare_loader(adaptive=True) is ignored: the run is neither adaptive "
                    "(fit(adaptive=...)) nor elastic (num_workers=(min, max))"
                )
            elif any(loader.sync is not None for loader in self._loaders):
                raise ValueError("only one loader can be adaptive=True: the training loader")
            else:
                sync = self.sync
        loader = prepare_loader(
            data,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            sync=sync,
            no_sync=self._no_sync if sync is not None else None,
            on_batch=self._sink.progress,
        )
        if sync is not None:
            sync.init_batch_size = loader.init_batch_size
            sync.ready = True
            if not self._plan_given:
                sync.plan = BatchPlan(loader.init_batch_size // self.world_size, 0, sync.plan.version)
        restored = self._restored.get("loaders", [])
        if len(self._loaders) < len(restored):
            loader.load_state_dict(restored[len(self._loaders)])
        elif self._epoch is not None:
            loader.set_epoch(self._epoch)
        self._loaders.append(loader)
        return loader

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for model in self._models:
                stack.enter_context(self._strategy.no_sync(model))
            yield

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Epoch numbers up to ``num_epochs``, restart-safe: after a restart, an epoch whose
        data was all consumed when the checkpoint was committed is skipped, and the one in
        progress continues (its loader resumes at the exact sample)."""
        saved = self._restored.get("epochs")
        start = 0
        if saved is not None:
            start = int(saved["epoch"]) + (1 if saved["done"] else 0)
        for epoch in range(start, num_epochs):
            self._epoch = epoch
            for loader in self._loaders:
                loader.set_epoch(epoch)
            yield epoch

    def accumulator(self) -> Accumulator:
        """Metric sums across replicas and restarts; see ``Accumulator``."""
        acc = Accumulator(world_size=self.world_size)
        restored = self._restored.get("accumulators", [])
        if len(self._accumulators) < len(restored):
            acc.load_state_dict(restored[len(self._accumulators)])
        self._accumulators.append(acc)
        return acc

    @property
    def batch_size(self) -> int | None:
        """The current global batch size of the training loader: the adaptive one, else
        the first prepared (None before any)."""
        for loader in self._loaders:
            if loader.sync is not None:
                return loader.batch_size
        return self._loaders[0].batch_size if self._loaders else None

    # -- reporting and checkpoints -------------------------------------------------
    def report(self, metrics: dict[str, Any], *, checkpoint: dict[str, Any] | None = None) -> None:
        """Report metrics, and optionally commit ``checkpoint`` (a state dict).

        Call it on every rank, at an optimizer-step boundary: the driver records rank 0's
        metrics and commits rank 0's checkpoint. The state is serialised here, so later
        changes to the tensors do not affect it. raylight adds its own state (loader
        positions, epochs, accumulators, adaptive state) under the key ``"_raylight"``.
        """
        plain = _plain_metrics(metrics)
        self._sink.heartbeat()
        self._seq += 1
        data = None
        if checkpoint is not None:
            if RAYLIGHT_KEY in checkpoint:
                raise ValueError(f"the checkpoint key {RAYLIGHT_KEY!r} is reserved for raylight")
            checkpoint = self._strategy.full_state(checkpoint)  # a collective when sharded
            own = self._collect_state()
            self._commit = own["commit"]
            if self.rank == 0 or self._elastic:
                data = serialize_state({**checkpoint, RAYLIGHT_KEY: own})
                if self._elastic:
                    self._sink.keep_commit(self._commit, data, self._seq)
        if self.rank == 0:
            self._sink.report(Report(metrics=plain, checkpoint=data, time=wall(), seq=self._seq))
        elif self._elastic:  # a copy, in case rank 0 dies before the driver hears it
            self._sink.report(
                Report(metrics=plain, time=wall(), seq=self._seq, has_checkpoint=checkpoint is not None)
            )

    def _collect_state(self) -> dict[str, Any]:
        """raylight's own part of a checkpoint. Synchronises accumulators: a collective."""
        training = [ld for ld in self._loaders if ld.sync is not None] or self._loaders
        state: dict[str, Any] = {
            "loaders": [ld.state_dict() for ld in self._loaders],
            "accumulators": [acc.state_dict() for acc in self._accumulators],
            "commit": self._commit + 1,
            "seq": self._seq,
        }
        if self._epoch is not None:
            done = bool(training) and all(ld.epoch == self._epoch and ld.epoch_done for ld in training)
            state["epochs"] = {"epoch": self._epoch, "done": done}
        if self.sync is not None:
            state["sync"] = self.sync.state_dict()
        return state

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


def call_train_loop(fn: Any, ctx: Any, config: dict[str, Any] | None) -> Any:
    """Call ``fn(ctx, config)``, or ``fn(ctx)`` when it takes one argument."""
    try:
        params = inspect.signature(fn).parameters
        positional = [
            p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        takes_config = len(positional) >= 2 or any(
            p.kind == p.VAR_POSITIONAL for p in params.values()
        )
    except (TypeError, ValueError):
        takes_config = True
    return fn(ctx, config if config is not None else {}) if takes_config else fn(ctx)


def run_worker_loop(
    fn: Any,
    config: dict[str, Any] | None,
    *,
    on_start: Callable[[TrainContext], None] | None = None,
    **context: Any,
) -> str:
    """A worker's entry (the worker group calls it in the loop thread, once the process
    group is formed): build its TrainContext from ``context`` and run ``fn``. Returns
    "finished", or "paused" when an elastic resize stopped the loop at a step boundary.
    ``on_start(ctx)`` runs just before the loop does."""
    ctx = TrainContext(config=config, **context)
    if on_start is not None:
        on_start(ctx)
    try:
        call_train_loop(fn, ctx, config)
    except ResizeInterrupt:
        return "paused"
    return "finished"


def _raylight_state(checkpoint: Checkpoint | None) -> dict[str, Any]:
    if checkpoint is None:
        return {}
    state = checkpoint.full_state().get(RAYLIGHT_KEY)
    return state if isinstance(state, dict) else {}


TrainLoop = Callable[..., Any]

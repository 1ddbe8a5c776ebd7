"""TrainContext: the one per-worker object a training loop talks to.

It knows this worker's place in the group (rank, world size, device), prepares the
model and data for data-parallel training, and carries reports and checkpoints to the
driver. It holds no global state: everything a worker needs is on this object.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import numbers
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from raylight.adaptive.plan import AdaptiveSpec, BatchPlan
from raylight.base.clock import wall
from raylight.storage.checkpoint import Checkpoint
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.adaptive.state import Accumulator, Accumulators
from raylight.worker.adaptive.sync import ResizeInterrupt, StepSync
from raylight.worker.checkpoints import WorkerCheckpoints
from raylight.worker.data.loader import ElasticLoader, prepare_loader
from raylight.worker.protocol import Report
from raylight.worker.strategies import DDPStrategy, Strategy

ReduceOp = Literal["mean", "sum", "max", "min"]


class ReportSink(Protocol):
    """Where a context sends what it learns; the worker actor or the in-process runner."""

    def report(self, report: Report) -> None: ...

    def progress(self, epoch: int, step: int, steps_per_epoch: int, samples: int) -> None: ...

    def heartbeat(self) -> None: ...

    def output(self, stream: str, text: str) -> None:
        """Forward a line of output to the driver (``raylight run``: its child's stdout
        and stderr, stream "stdout" or "stderr", and its events, stream "event")."""

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
    """Metrics as JSON values: tensors and numpy values become numbers and lists, tuples
    lists. Anything else (an object, a lock, a model) is a TypeError naming the metric:
    the metrics are the run's JSON history, and an object could not even travel from a
    worker to the driver."""
    if not isinstance(metrics, dict):
        raise TypeError(f"ctx.report needs a dict of metrics, got {type(metrics).__name__}")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be strings, got {key!r}")
        out[key] = _plain(value, repr(key))
    return out


_JSON_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, numbers.Number):
        return value.item() if hasattr(value, "item") else float(value)  # type: ignore[arg-type]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy arrays and bools
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, _JSON_SCALARS):
                raise TypeError(f"metric {where} has a key {k!r}: keys must be strings or numbers")
            out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    raise TypeError(
        f"metric {where} is a {type(value).__module__}.{type(value).__qualname__}: report numbers, "
        "strings, None, or lists and dicts of them (tensors and numpy values become numbers), "
        "and put objects in the checkpoint (ctx.report(metrics, checkpoint={...}))"
    )


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
        checkpoint_dir: str | None = None,
        next_checkpoint: int | None = None,
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
        self._strategy = strategy or DDPStrategy()
        self._elastic = elastic
        self._ckpt = WorkerCheckpoints(
            rank=rank, world_size=world_size, strategy=self._strategy, sink=sink, checkpoint=checkpoint,
            checkpoint_dir=checkpoint_dir, next_checkpoint=next_checkpoint, elastic=elastic,
        )
        self._restored = self._ckpt.restored
        self._seq = int(self._restored.get("seq", -1))  # of the last report
        self._loaders: list[ElasticLoader] = []
        self._accumulators = Accumulators(world_size=world_size, saved=self._restored.get("accumulators", []))
        self._models: list[nn.Module] = []
        self._optimizer: AdaptiveOptimizer | None = None
        self._epoch: int | None = None
        self._plan_given = adaptive is not None and adaptive.plan is not None
        self.sync: StepSync | None = None
        # The driver asked the loop to stop (``_request_stop``): a loop of raylight's own
        # that stops itself (``raylight run``'s agent) waits on it.
        self._stop_asked = threading.Event()
        self._stop_snapshot = False
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
                replicated=self._strategy.replicated,
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
        self.use_strategy_reducer()
        return wrapped

    def use_strategy_reducer(self) -> None:
        """Adaptive training's control all-reduces go through the strategy's faster sum
        where it offers one (every rank alike: the strategy set it up collectively)."""
        reducer = self._strategy.sum_reducer()
        if reducer is not None and self.sync is not None:
            self.sync.reduce_sum = reducer

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever ``prepare_model`` wrapped it in."""
        return self._strategy.unwrap_model(model)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        """Prepare ``optimizer`` for the strategy (with FSDP, a full optimizer state dict
        loads into it sharded) and for adaptive training: gradient accumulation, the LR
        rule (applied to each step's rate explicitly and restored after it) and
        gradient-noise measurement. Without ``fit(adaptive=...)`` the same optimizer is
        returned.

        ``max_grad_norm``: clip the gradient of every optimizer step to this total norm
        (``torch.nn.utils.clip_grad_norm_``'s), right before the step: the gradient the step
        applies, averaged over the workers and, in an adaptive run, over the step's
        accumulated micro-steps (clipping in the loop, before ``opt.step()``, would clip each
        micro-step's partial sum instead). Under DeepSpeed it is the engine's
        ``gradient_clipping``. ``ctx.grad_norm`` is the norm each step found."""
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not (isinstance(max_grad_norm, int | float) and 0 < max_grad_norm < math.inf)):
            raise ValueError(f"max_grad_norm must be a positive finite number, got {max_grad_norm!r}")
        adaptive = self.sync is not None and self.sync.adaptive
        optimizer = self._strategy.wrap_optimizer(
            optimizer, adaptive=adaptive, max_grad_norm=None if max_grad_norm is None else float(max_grad_norm)
        )
        if self.sync is None or not adaptive:
            return optimizer
        self._optimizer = AdaptiveOptimizer(optimizer, sync=self.sync)
        return self._optimizer

    @property
    def grad_norm(self) -> float | None:
        """The total norm of the gradient the last optimizer step applied, before clipping:
        with ``prepare_optimizer(max_grad_norm=...)``, and always under DeepSpeed (its engine
        computes it); None otherwise and before the first step."""
        return self._strategy.grad_norm()

    def prepare_loader(
        self,
        data: Dataset | DataLoader,
        *,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool | None = None,
        adaptive: bool = False,
    ) -> ElasticLoader:
        """Shard a map-style dataset (or a DataLoader's dataset) across the workers.

        ``batch_size`` is the *global* batch size; each worker loads
        ``batch_size // world_size`` samples per step. ``shuffle`` and ``drop_last`` default
        to False. With a DataLoader, its ``batch_size``, ``shuffle`` (a ``RandomSampler``),
        ``drop_last``, ``collate_fn``, ``num_workers`` and the settings of its worker
        processes are used unless overridden; a sampler the loader cannot keep while it
        shards the data (a ``DistributedSampler``, a weighted or custom one, a
        ``batch_sampler``) is a ``TypeError`` saying what to pass instead.
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
            on_layout=self._layout if sync is not None else None,
        )
        if sync is not None:
            sync.init_batch_size = loader.init_batch_size
            sync.dataset_size = loader.num_samples
            sync.ready = True
            if not self._plan_given:
                sync.plan = BatchPlan(loader.init_batch_size // self.world_size, 0, sync.plan.version)
        if sync is not None or not self._loaders:  # the training loader (as in batch_size)
            self._strategy.set_batch_layout(
                micro_batch=loader.local_batch_size, accumulation=loader.plan.accum_steps + 1
            )
        restored = self._restored.get("loaders", [])
        if len(self._loaders) < len(restored):
            loader.load_state_dict(restored[len(self._loaders)])
        elif self._epoch is not None:
            loader.set_epoch(self._epoch)
        self._loaders.append(loader)
        return loader

    def _layout(self, micro_batch: int, accumulation: int) -> None:
        self._strategy.set_batch_layout(micro_batch=micro_batch, accumulation=accumulation)

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
        return self._accumulators.make(self._epoch)

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
        """Report metrics, and optionally commit ``checkpoint``.

        ``checkpoint`` is a dict of state dicts, tensors and plain values; modules and
        optimizers may be given as objects (``{"model": model, "opt": opt, "epoch": 3}``),
        which stores their state keyed by parameter name and works with every strategy
        (``load_checkpoint`` puts it back). Call it on every rank, at an optimizer-step
        boundary. With DDP (and ``FSDP(checkpoint="full")``) rank 0's state is serialised
        here and the driver commits it; with a sharded strategy every rank writes its own
        shards into the run's storage first (a collective) and the driver commits them.
        Later changes to the tensors do not affect a reported checkpoint. raylight adds
        its own state (loader positions, epochs, accumulators, adaptive state) under the
        key ``"_raylight"``.
        """
        self._report(_plain_metrics(metrics), checkpoint)

    def _report(self, plain: dict[str, Any], checkpoint: dict[str, Any] | None, *, snapshot: bool = False) -> None:
        self._sink.heartbeat()
        self._seq += 1
        data = None
        sharded_index = None
        if checkpoint is not None:
            data, sharded_index = self._ckpt.save(checkpoint, self._collect_state, seq=self._seq)
        if self.rank == 0:
            self._sink.report(
                Report(
                    metrics=plain, checkpoint=data, time=wall(), seq=self._seq,
                    sharded_index=sharded_index, snapshot=snapshot,
                )
            )
        elif self._elastic:  # a copy, in case rank 0 dies before the driver hears it
            self._sink.report(
                Report(
                    metrics=plain, time=wall(), seq=self._seq, has_checkpoint=checkpoint is not None,
                    snapshot=snapshot,
                )
            )

    def _snapshot(self) -> bool:
        """A preemption's just-in-time checkpoint, at the step boundary every rank stopped
        at: the entries of the loop's last checkpoint (its modules and optimizers as they
        are now, its plain values as it last reported them) or the objects it loads into,
        with raylight's own state (the loaders' positions now). Called on every rank.
        False when the loop never named what its checkpoint holds."""
        if self._ckpt.entries is None:
            self.logger.warning(
                "preemption notice: no just-in-time checkpoint (the loop has neither "
                "reported a checkpoint nor called ctx.load_checkpoint(objects)); the run "
                "resumes from its last committed checkpoint"
            )
            return False
        self._report({}, self._ckpt.entries, snapshot=True)
        return True

    def _report_snapshot(self, metrics: dict[str, Any], checkpoint: dict[str, Any]) -> None:
        """raylight's own loops (``raylight run``): a checkpoint taken because a stop with
        a snapshot was asked for (a notice); the driver commits it as a snapshot."""
        self._report(_plain_metrics(metrics), checkpoint, snapshot=True)

    def _request_stop(self, *, snapshot: bool) -> None:
        """The driver asks the loop to stop at its next step boundary (``snapshot``: with
        a checkpoint there: a notice). raylight's training loop hears it through its
        ``StepSync``; a loop that stops itself (``raylight run``'s agent, which tells its
        script) waits on ``_stop_asked``; any other loop does not stop."""
        self._stop_snapshot = self._stop_snapshot or snapshot
        self._stop_asked.set()
        if self.sync is not None:
            self.sync.request_stop(snapshot=snapshot)

    def load_checkpoint(self, objects: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Load the checkpoint this (re)start resumes from into ``objects`` and return the
        rest of it; None when there is none (a fresh start).

        ``objects`` maps checkpoint keys to the prepared modules and optimizers to fill
        (``{"model": model, "opt": opt}``); the returned dict holds every other entry
        (``{"epoch": 3}``). With a sharded checkpoint each rank reads only the shards it
        holds, laid out for the current number of workers (a checkpoint written by 2
        workers loads into 1 or 3); a full one is loaded whole and, under a sharded
        strategy, sharded locally. Call it on every rank, after ``prepare_model`` and
        ``prepare_optimizer``.
        """
        return self._ckpt.load(objects, unwrap=self.unwrap_model)

    def _collect_state(self) -> dict[str, Any]:
        """raylight's own part of a checkpoint. Synchronises accumulators: a collective."""
        training = [ld for ld in self._loaders if ld.sync is not None] or self._loaders
        state: dict[str, Any] = {
            "loaders": [ld.state_dict() for ld in self._loaders],
            "accumulators": self._accumulators.state(self._epoch),
            "commit": self._ckpt.commit + 1,
            "seq": self._seq,
        }
        if self._epoch is not None:
            # Done: its data consumed and the loop past it (a checkpoint on the epoch's last
            # batch, inside the loop over it, resumes into the epoch so that its end runs).
            done = bool(training) and all(
                ld.epoch == self._epoch and ld.epoch_done and not ld.iterating for ld in training
            )
            state["epochs"] = {"epoch": self._epoch, "done": done}
        if self.sync is not None:
            state["sync"] = self.sync.state_dict()
        return state

    def get_checkpoint(self) -> Checkpoint | None:
        """The last committed checkpoint when this run (re)started, else None."""
        return self._ckpt.checkpoint

    def heartbeat(self) -> None:
        """Tell the driver this worker is alive; call it inside very long steps."""
        self._sink.heartbeat()

    def _output(self, stream: str, text: str) -> None:
        """raylight's own loops (``raylight run``): send a line to the driver with the
        next poll (``Trainer(on_poll=...)`` sees it in ``WorkerPoll.output``)."""
        self._sink.output(stream, text)

    def _started(self) -> None:
        """raylight's own loops (``raylight run``): count one step, of no samples, when
        the loop's work has begun (its script formed its process group, or reported). The
        driver times a resize to the first step after it, and an elastic run decides its
        size again only after that."""
        self._sink.progress(0, 0, 0, 0)

    # -- collectives ---------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reaches this point."""
        if self.world_size > 1:
            dist.barrier()
        self._sink.heartbeat()

    def all_reduce(self, value: Any, op: ReduceOp = "mean") -> Any:
        """Reduce a number or tensor across workers; returns the same kind it was given.
        A tensor is reduced where it is (NCCL for a GPU tensor); a number in CPU memory
        (gloo, which every raylight group has beside NCCL): no copy to the GPU and back."""
        if op not in ("mean", "sum", "max", "min"):
            raise ValueError(f"op must be one of mean, sum, max, min; got {op!r}")
        is_tensor = isinstance(value, torch.Tensor)
        tensor = value.detach().clone() if is_tensor else torch.tensor(float(value), dtype=torch.float64)
        if self.world_size > 1:
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
            return tensor
        return tensor.item()

    def __repr__(self) -> str:
        return f"TrainContext(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    # A loop written as Ray Train's `train_func(config)` gets the context, not the config:
    # every way of reading a dict says so (config[...], config.get(...), "key" in config, ...).
    def __getitem__(self, key: Any) -> Any:
        raise TypeError(_not_the_config(f"looked up {key!r}"))

    def __contains__(self, key: Any) -> bool:
        raise TypeError(_not_the_config(f"asked whether it holds {key!r}"))

    def __getattr__(self, name: str) -> Any:
        # only for attributes a TrainContext lacks: its own are found before this runs
        if name in _DICT_METHODS:
            raise AttributeError(_not_the_config(f"called .{name}(...), a dict's method"), name=name, obj=self)
        raise AttributeError(f"'TrainContext' object has no attribute {name!r}", name=name, obj=self)


_DICT_METHODS = frozenset({"get", "keys", "items", "values", "setdefault", "pop", "popitem", "update", "copy"})


def _not_the_config(what: str) -> str:
    return (
        f"the TrainContext is not the loop's config ({what}): raylight calls a loop of one argument "
        "as loop(ctx); define it as loop(ctx, config), or read ctx.config (a Ray Train train_func(config) "
        "runs unchanged under raylight.ray_train.TorchTrainer, see docs/ray_train.md)"
    )


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
    except ResizeInterrupt as stop:
        if stop.snapshot:
            ctx._snapshot()
        return "paused"
    finally:
        ctx._strategy.close()  # before the worker destroys the process group
    return "finished"


TrainLoop = Callable[..., Any]

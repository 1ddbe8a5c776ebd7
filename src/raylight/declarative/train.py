"""Training a declarative model with the core engine, then saving and evaluating it."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from raylight.declarative.config.model import ModelConfig
from raylight.declarative.lr_schedule import RateSchedule
from raylight.declarative.metrics import MINIMIZED, metric_key
from raylight.declarative.model_dir import (
    MODEL_FILE,
    MODEL_FORMAT,
    WEIGHTS_FILE,
    check_model_dir,
    damaged_note,
)
from raylight.declarative.optimizers import (
    OPTIMIZERS,
    build_optimizer,
    eval_mode,
    takes_closure,
    train_mode,
)
from raylight.declarative.outputs import OUTPUTS
from raylight.worker.data.blocks import BlockDataset

if TYPE_CHECKING:
    from raylight.worker.context import TrainContext

TARGET_KEY = "__target__"
__all__ = ["OPTIMIZERS", "LoadedModel", "declarative_loop", "evaluate_data", "load_model", "save_model"]

class ArrayDataset(torch.utils.data.Dataset):
    """Rows of a dict of equally long arrays, as dicts of tensors."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        # Copies: arrays from the object store are read-only, which torch warns about.
        self.arrays = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}
        self.n = len(next(iter(self.arrays.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.arrays.items()}

    def get_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Rows ``indices`` stacked, one indexing per array: what collating ``self[i]`` row
        by row gives, without a Python call per row (``raylight.worker.data.loader.fetch_batch``)."""
        index = torch.as_tensor(indices, dtype=torch.long)
        return {k: v[index] for k, v in self.arrays.items()}


EVAL_ROWS = 65_536  # rows per evaluation chunk: trainer.eval_batch_size's default


def _chunks(data: Any, rows: int) -> Iterator[dict[str, np.ndarray]]:
    """In-memory arrays, or object-store blocks one at a time, in slices of ``rows`` rows."""
    from raylight.declarative.ray_data import BlockRefs

    parts = BlockDataset(data.blocks, data.lengths, cache_blocks=1).iter_blocks() if isinstance(data, BlockRefs) else [data]
    for part in parts:
        n = len(next(iter(part.values())))
        for lo in range(0, n, rows):
            yield {k: v[lo : lo + rows] for k, v in part.items()}


def evaluate_data(
    model: torch.nn.Module, data: Any, outputs: Any, meta: dict[str, Any], device: torch.device,
    reduce: Callable[[dict[str, float]], dict[str, float]] | None = None, chunk_rows: int | None = None,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, float]:
    """Loss and metrics of ``model`` on ``data`` (arrays or object-store blocks), streamed
    ``chunk_rows`` rows at a time (trainer.eval_batch_size; None: EVAL_ROWS): sums over chunks,
    so nothing larger than a chunk is held at once, but for a binary output's scores and
    labels (ROC AUC ranks them all: 16 bytes a row). ``reduce`` adds up the sums, and
    ``gather`` concatenates the (score, label) rows, of every process that evaluated a part
    of the data.

    ``outputs``: the output features (one, or a list). The keys are ``metric_key``'s: one
    output's metrics by their names; with several, each output's as ``<output>/<metric>``
    and ``loss``, Ludwig's combined loss (each output's loss times its ``loss_weight``,
    summed)."""
    outputs = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    types = [OUTPUTS[out.type] for out in outputs]
    sums = [dict.fromkeys(["n", "loss", *kind.sum_names(out, meta[out.name])], 0.0) for kind, out in zip(types, outputs, strict=True)]
    ranked: dict[int, list[np.ndarray]] = {i: [] for i, kind in enumerate(types) if kind.RANKS}
    losses = [kind.loss(out) for kind, out in zip(types, outputs, strict=True)]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for chunk in _chunks(data, chunk_rows or EVAL_ROWS):
            batch = {k: torch.from_numpy(np.array(v)).to(device) for k, v in chunk.items()}
            targets = {out.name: batch.pop(out.name).cpu() for out in outputs}
            if len(targets[outputs[0].name]) == 0:
                continue
            raw = model(batch)
            for i, (kind, out) in enumerate(zip(types, outputs, strict=True)):
                mine, target, n = raw[out.name].cpu(), targets[out.name], len(targets[out.name])
                sums[i]["n"] += n
                sums[i]["loss"] += float(losses[i](mine, target)) * n
                scored = kind.add_sums(sums[i], out, mine, target, meta[out.name])
                if i in ranked and scored is not None:
                    ranked[i].append(scored)
    model.train(was_training)
    if reduce is not None:  # one flat dict of floats for the processes to add up
        flat = reduce({f"{i}:{k}": v for i, mine in enumerate(sums) for k, v in mine.items()})
        sums = [{k: flat[f"{i}:{k}"] for k in mine} for i, mine in enumerate(sums)]
    metrics: dict[str, float] = {}
    for i, (kind, out) in enumerate(zip(types, outputs, strict=True)):
        scored = None
        if i in ranked:
            scored = np.concatenate(ranked[i]) if ranked[i] else np.zeros((0, 2))
            scored = gather(scored) if gather is not None else scored
        mine = {"loss": sums[i]["loss"] / (sums[i]["n"] or 1.0), **kind.metrics(out, sums[i], scored, meta[out.name])}
        metrics.update(mine if len(outputs) == 1 else {f"{out.name}/{k}": v for k, v in mine.items()})
    if len(outputs) > 1:
        metrics = {"loss": sum(out.loss_weight * metrics[f"{out.name}/loss"] for out in outputs), **metrics}
    return metrics


def training_dataset(data: Any) -> ArrayDataset | BlockDataset:
    """Object-store blocks stay there (read a block at a time); arrays are held in memory."""
    from raylight.declarative.ray_data import BlockRefs

    if isinstance(data, BlockRefs):
        return BlockDataset(data.blocks, data.lengths)
    return ArrayDataset(data)


def from_store(data: Any) -> Any:
    """A split as the loop config carries it: arrays, blocks (``BlockRefs``), None, or a
    reference to arrays put into Ray's object store once by the driver (``api.in_store``),
    fetched here (zero-copy on the node that holds them)."""
    from raylight.declarative.ray_data import BlockRefs

    if data is None or isinstance(data, dict | BlockRefs):
        return data
    import ray

    return ray.get(data)


def regularization(kind: str | None, weight: float) -> Callable[[torch.nn.Module], torch.Tensor] | None:
    """Ludwig's ``trainer.regularization_type`` and ``regularization_lambda``: the penalty a
    step adds to its loss, over every parameter (None: no penalty). Each rank adds it to its
    own loss; its gradient, averaged over the ranks, is the one process's."""
    if kind is None or weight == 0:
        return None

    def penalty(model: torch.nn.Module) -> torch.Tensor:
        params = list(model.parameters())
        total = torch.zeros((), device=params[0].device)
        if kind in ("l1", "l1_l2"):
            total = total + sum(p.abs().sum() for p in params)
        if kind in ("l2", "l1_l2"):
            total = total + sum(p.square().sum() for p in params)
        return weight * total

    return penalty


class TrainStep:
    """One optimizer step of the declarative loop: the forward pass, the outputs' losses
    (their weighted sum, or ``trainer.loss_balancing``'s total), the penalty and a
    combiner's own loss, the backward pass and the step. A closure optimizer (lbfgs)
    runs the same pass as its closure, as often as it asks, each time with the gradients
    averaged over the workers (DDP's backward) and the loss it returns averaged too, so
    that every worker's line search takes the same decisions as one process's."""

    def __init__(self, ctx: TrainContext, model: torch.nn.Module, cfg: ModelConfig, balancer: Any) -> None:
        self.ctx, self.model, self.outs, self.balancer = ctx, model, list(cfg.output_features), balancer
        self.loss_fns = {out.name: OUTPUTS[out.type].loss(out) for out in self.outs}
        self.penalty = regularization(cfg.trainer.regularization_type, cfg.trainer.regularization_lambda)
        self.balanced = cfg.trainer.loss_balancing != "none"
        self.closure = takes_closure(cfg.trainer.optimizer)
        unwrapped = ctx.unwrap_model(model)
        self.combiner = unwrapped.combiner
        self.shared = [p for name, p in unwrapped.named_parameters() if not name.startswith("decoders.")]

    def _mean(self, value: torch.Tensor) -> torch.Tensor:
        return self.ctx.all_reduce(value) if self.ctx.world_size > 1 else value

    def _pass(self, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        opt.zero_grad()
        raw = self.model(batch)
        losses = [self.loss_fns[out.name](raw[out.name], targets[out.name]) for out in self.outs]
        # Ludwig's loss.weight on each output; the outputs' losses add up (its combined loss)
        weighted = sum(loss * out.loss_weight if out.loss_weight != 1 else loss for loss, out in zip(losses, self.outs, strict=True))
        assert isinstance(weighted, torch.Tensor)
        trained = self.balancer.total(losses, self._mean, self.shared) if self.balanced else weighted
        total = trained + self.penalty(self.model) if self.penalty is not None else trained
        # a combiner's own loss (TabNet's sparsity), as Ludwig adds it to the training loss
        extra = getattr(self.combiner, "loss", None)
        total = total + extra if extra is not None else total
        total.backward()
        for param in self.balancer.parameters():  # not the model's: DDP does not average them
            if param.grad is not None and self.ctx.world_size > 1:
                param.grad.copy_(self.ctx.all_reduce(param.grad))
        return losses, weighted, total

    def __call__(self, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One step; the outputs' losses and their weighted sum before it."""
        if not self.closure:
            losses, weighted, _ = self._pass(opt, batch, targets)
            opt.step()
            return losses, weighted
        first: list[Any] = []

        def closure() -> float:
            losses, weighted, total = self._pass(opt, batch, targets)
            if not first:
                first.extend([losses, weighted])
            return self._mean(total.detach())  # type: ignore[return-value]  # LBFGS takes the tensor (float() it)

        opt.step(closure)
        return first[0], first[1]


def _balancer(cfg: ModelConfig, device: torch.device) -> Any:
    from raylight.declarative.loss_balancing import build_balancer

    t = cfg.trainer
    return build_balancer(
        t.loss_balancing, [out.loss_weight for out in cfg.output_features], lr=t.loss_balancing_lr,
        preference=t.loss_balancing_preference_vector, tchebycheff=t.loss_balancing_tchebycheff_weight, device=device,
    )


def declarative_loop(ctx: TrainContext, config: dict[str, Any]) -> None:
    """The per-worker loop raylight.fit runs for `raylight train`."""
    from raylight.declarative.models import build_model

    cfg = ModelConfig.model_validate(config["model_config"])
    assert config["train"] is not None, "the training split is never empty"
    train_split, val_data = from_store(config["train"]), from_store(config["validation"])
    train_data = training_dataset(train_split)
    meta, outs = config["meta"], list(cfg.output_features)
    kinds = {out.name: out.type for out in outs}
    torch.manual_seed(cfg.trainer.seed)
    model = ctx.prepare_model(build_model(cfg, meta))
    _start_decoders(ctx, model, train_split, cfg)
    lr = config["learning_rate"]
    balancer = _balancer(cfg, ctx.device)
    base = build_optimizer(cfg.trainer.optimizer, [*model.parameters(), *balancer.parameters()], lr)
    opt = ctx.prepare_optimizer(base, max_grad_norm=cfg.trainer.gradient_clipping.clipglobalnorm)
    # best["metric"]: the best score so far, lower is better (a metric that improves as it
    # rises, accuracy or r2, is negated)
    best: dict[str, Any] = {"metric": math.inf, "epoch": -1, "state": None}
    sign = 1.0 if cfg.trainer.validation_metric in MINIMIZED else -1.0
    judged_by = metric_key(kinds, cfg.trainer.validation_field, cfg.trainer.validation_metric)
    rates = RateSchedule(cfg, base_lr=lr, batch_size=config["batch_size"], train_rows=len(train_data))
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        best = state["best"]
        rates.load_state_dict(state.get("rates"))
        balancer.load_state_dict(state.get("balancer") or {})
    loader = ctx.prepare_loader(
        train_data,
        batch_size=config["batch_size"],
        shuffle=True,
        seed=cfg.trainer.seed,
        adaptive=config["adaptive"],
    )
    step = TrainStep(ctx, model, cfg, balancer)
    stats = ctx.accumulator()
    for epoch in ctx.epochs(rates.epochs):
        rates.apply(opt, loader)
        train_mode(base)  # schedule_free_adamw: its training point (nothing for other types)
        for batch in loader if not rates.spent(loader) else ():
            targets = {out.name: batch.pop(out.name) for out in outs}
            losses, weighted = step(opt, batch, targets)
            rates.apply(opt, loader)  # after a step (the loader has moved on): the next one's rate
            n = len(targets[outs[0].name])
            # the reported loss: one output's own (unweighted), or the combined loss; the sums
            # stay tensors on the device until the epoch's end (no wait for a GPU per step)
            stats[f"loss{epoch}"] += (losses[0] if len(outs) == 1 else weighted).detach() * n
            stats[f"n{epoch}"] += n
            if len(outs) > 1:
                for i, loss in enumerate(losses):
                    stats[f"loss{epoch}/{i}"] += loss.detach() * n
            if rates.spent(loader):  # trainer.train_steps reached: the run ends with this epoch
                break
        eval_mode(base)  # schedule_free_adamw: evaluated and saved at its average
        with stats.synchronized():
            rows = max(stats[f"n{epoch}"], 1)
            train_loss = stats[f"loss{epoch}"] / rows
            each = {f"train_{out.name}/loss": stats[f"loss{epoch}/{i}"] / rows for i, out in enumerate(outs) if len(outs) > 1}
        report: dict[str, Any] = {"epoch": epoch, "train_loss": train_loss, "batch_size": ctx.batch_size}
        val: dict[str, float] = {}
        if val_data is not None:  # every rank: the same numbers, the same decision
            val = evaluate_data(model, val_data, outs, meta, ctx.device, chunk_rows=cfg.trainer.eval_batch_size)
            # the loss and the metric followed first: a progress line shows the first few
            first = {k: val[k] for k in ("loss", judged_by)}
            report.update({f"validation_{k}": v for k, v in {**first, **val}.items()})
            judged, score = val["loss"], sign * val[judged_by]
        else:
            judged = score = train_loss
        report.update(each)  # after the validation metrics, which a progress line shows first
        if cfg.trainer.evaluate_training_set:  # every rank: the whole split, the same numbers
            seen = evaluate_data(model, train_split, outs, meta, ctx.device, chunk_rows=cfg.trainer.eval_batch_size)
            report.update({f"train_{k}": v for k, v in seen.items() if not k.endswith("loss")})
        rates.evaluated(train_loss, val)
        if rates.schedule is not None:  # the rate of the epoch's last step
            report["learning_rate"] = rates.last
        diverged = not math.isfinite(judged)  # a NaN or infinite loss: training cannot recover from it
        if not diverged and score < best["metric"]:
            best = {"metric": score, "epoch": epoch, "state": {k: v.detach().cpu().clone() for k, v in ctx.unwrap_model(model).state_dict().items()}}
        stop = diverged or (cfg.trainer.early_stop >= 0 and epoch - best["epoch"] >= cfg.trainer.early_stop)
        stop = stop or rates.spent(loader)
        report["early_stop"] = stop
        report["diverged"] = diverged
        ctx.report(report, checkpoint={
            "model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict(), "best": best,
            "rates": rates.state_dict(), "balancer": balancer.state_dict(),
        })
        if stop:
            break


def _rows(data: Any) -> int:
    from raylight.declarative.ray_data import BlockRefs

    if data is None:
        return 0
    return int(sum(data.lengths)) if isinstance(data, BlockRefs) else len(next(iter(data.values())))


def calibrate_state(config: ModelConfig, meta: dict[str, Any], state: dict[str, torch.Tensor], validation: Any, train: Any) -> dict[str, torch.Tensor]:
    """``state`` with the temperatures of the outputs with ``decoder.calibration`` fitted on
    the validation split (the training split where it has fewer than 3 rows, Ludwig's rule;
    ``models/uncertainty.py``); ``state`` itself where no output asks for calibration."""
    from raylight.declarative.models import build_model
    from raylight.declarative.models.uncertainty import MIN_ROWS, calibrated

    outs = list(config.output_features)
    if not any(out.decoder.calibration for out in outs):
        return state
    model = build_model(config, meta)
    model.load_state_dict(state)
    validation = from_store(validation)  # arrays the driver put into Ray's object store: fetched
    split = validation if _rows(validation) >= MIN_ROWS else from_store(train)
    calibrated(model, _chunks(split, config.trainer.eval_batch_size or EVAL_ROWS), outs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _start_decoders(ctx: TrainContext, model: torch.nn.Module, train_split: Any, cfg: ModelConfig) -> None:
    """A decoder's start (an anomaly output's center) before the first step; a run resumed
    from a checkpoint has it in its weights."""
    if ctx.get_checkpoint() is None:
        from raylight.declarative.models.anomaly import start_centers

        outs = list(cfg.output_features)
        start_centers(ctx.unwrap_model(model), _inputs(train_split, outs, cfg.trainer.eval_batch_size, ctx.device))


def _inputs(data: Any, outs: list[Any], rows: int | None, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
    """A split's input arrays as tensors on ``device``, ``rows`` at a time (targets left out)."""
    targets = {out.name for out in outs}
    for chunk in _chunks(data, rows or EVAL_ROWS):
        yield {k: torch.from_numpy(np.array(v)).to(device) for k, v in chunk.items() if k not in targets}


def finish_meta(config: ModelConfig, meta: dict[str, Any], state: dict[str, torch.Tensor], validation: Any, train: Any) -> dict[str, Any]:
    """``meta`` with what the output types that fit values after training (``after_training``:
    an anomaly output's radius and threshold) fit from the trained model's raw outputs on the
    training and validation splits; ``meta`` itself where none does."""
    from raylight.declarative.models import build_model

    outs = [out for out in config.output_features if hasattr(OUTPUTS[out.type], "after_training")]
    if not outs:
        return meta
    model = build_model(config, meta)
    model.load_state_dict(state)
    model.eval()

    def scores(data: Any) -> dict[str, np.ndarray] | None:
        data = from_store(data)
        if _rows(data) == 0:
            return None
        with torch.no_grad():
            raws = [model(batch) for batch in _inputs(data, list(config.output_features), config.trainer.eval_batch_size, torch.device("cpu"))]
        return {out.name: np.concatenate([r[out.name].double().numpy() for r in raws]) for out in outs}

    seen, held = scores(train), scores(validation)
    fitted = {
        out.name: OUTPUTS[out.type].after_training(  # type: ignore[attr-defined]
            out, seen[out.name] if seen else np.zeros(0), held[out.name] if held else None,
        )
        for out in outs
    }
    return {**meta, **{name: {**meta[name], **values} for name, values in fitted.items()}}


def save_model(path: str, config: ModelConfig, meta: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """``path``/weights.safetensors and ``path``/model.json (config + preprocessing)."""
    from safetensors.torch import save_file

    from raylight.storage.run_dir import atomic_path, atomic_write

    os.makedirs(path, exist_ok=True)
    with atomic_path(os.path.join(path, WEIGHTS_FILE)) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
    # model.json last: a directory with it is a whole model.
    atomic_write(os.path.join(path, MODEL_FILE), json.dumps({"config": config.model_dump(mode="json"), "meta": meta, "format": MODEL_FORMAT}))


def check_sharding(config: ModelConfig, meta: dict[str, Any], *, num_workers: int | tuple[int, int]) -> None:
    """An FSDP run's model checked in the driver before any worker starts (``check_shardable``):
    built from the preprocessed metadata on the meta device, so nothing is allocated."""
    from raylight.config.schema import FSDP
    from raylight.declarative.models import build_model
    from raylight.worker.strategies.fsdp import check_shardable

    strategy = config.backend.trainer.strategy
    if strategy != "fsdp" and not isinstance(strategy, FSDP):
        return
    options = strategy if isinstance(strategy, FSDP) else FSDP()
    most = max(num_workers) if isinstance(num_workers, tuple) else num_workers
    with torch.device("meta"):
        model = build_model(config, meta)
    sharded = most > 1 or bool(options.mixed_precision or options.cpu_offload)
    check_shardable(model, options, sharded=sharded, setting="backend.trainer.strategy")


def _build_checked(config: ModelConfig, meta: dict[str, Any], model_json: str, damaged: str) -> torch.nn.Module:
    """The model ``model.json`` describes; its metadata must hold what each feature needs."""
    from raylight.base.exceptions import ConfigError
    from raylight.declarative.models import build_model

    try:
        return build_model(config, meta)
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
        raise ConfigError(
            f"{model_json!r}: its preprocessing metadata does not fit its config "
            f"({type(exc).__name__}: {exc}): {damaged}"
        ) from None


def _load_weights(model: torch.nn.Module, path: str, damaged: str) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from raylight.base.exceptions import ConfigError

    if not os.path.exists(path):
        raise ConfigError(f"the weights file {path!r} is missing: {damaged}")
    try:
        weights = load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"the weights file {path!r} cannot be read ({exc}): {damaged}") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        first = " ".join(str(exc).split())[:400]
        raise ConfigError(f"the weights in {path!r} do not fit the model in model.json ({first}): {damaged}") from None


class LoadedModel:
    """A trained declarative model: ``predict`` and ``evaluate`` in plain Python, no Ray."""

    def __init__(self, path: str) -> None:
        self.config, self.meta = check_model_dir(path)
        model_json, damaged = os.path.join(path, MODEL_FILE), damaged_note(path)
        self.model = _build_checked(self.config, self.meta, model_json, damaged)
        _load_weights(self.model, os.path.join(path, WEIGHTS_FILE), damaged)
        self.model.eval()
        self.outputs = list(self.config.output_features)

    def _arrays(self, df: pd.DataFrame, *, with_outputs: bool, source: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        from raylight.declarative.preprocess import check_columns, transform

        check_columns(df, self.config, with_outputs=with_outputs, source=source)
        return transform(df, self.config, self.meta, with_outputs=with_outputs)

    def predict(self, df: pd.DataFrame, *, source: str = "input") -> pd.DataFrame:
        """One row per input row, in order: for each output, ``<output>_predictions``
        and, for classifiers, probabilities. Rows a drop_row strategy rejects get nulls.
        ``source`` names the data in error messages."""
        arrays, keep = self._arrays(df, with_outputs=False, source=source)
        result = pd.DataFrame(index=df.index)
        batch = {k: torch.from_numpy(v) for k, v in arrays.items()}
        with torch.no_grad():
            raw = self.model(batch)
        sampled = {out.name: out for out in self.outputs if out.decoder.mc_dropout_samples}
        spread = _mc_dropout(self.model, batch, sampled, raw, seed=self.config.trainer.seed) if sampled else {}
        for output in self.outputs:
            for column, values in _predicted(output, raw[output.name], self.meta[output.name], keep).items():
                result[column] = values
            if output.name in spread:  # Ludwig's <output>_uncertainty: the MC samples' variance
                result[f"{output.name}_uncertainty"] = _column(spread[output.name], keep)
        return result.reset_index(drop=True)

    def evaluate(
        self, df: pd.DataFrame, *, source: str = "input", part: tuple[int, int] | None = None,
        reduce: Callable[[dict[str, float]], dict[str, float]] | None = None,
        gather: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> dict[str, float]:
        """Metrics on ``df``; ``part=(rank, world_size)`` evaluates that share of its rows,
        ``reduce`` adds up every share's sums and ``gather`` joins a binary output's scores
        (processes a launcher started)."""
        from raylight.base.exceptions import ConfigError
        from raylight.declarative.preprocess import check_target

        arrays, _ = self._arrays(df, with_outputs=True, source=source)  # checks the columns first
        check_target(df, self.config, source)
        first = self.outputs[0]
        if len(arrays[first.name]) == 0:
            targets = " or ".join(repr(out.col) for out in self.outputs)
            raise ConfigError(
                f"no rows to evaluate: every row of the {len(df)} given lacks the target "
                f"{targets} or is dropped by a drop_row strategy"
            )
        if part is not None:
            rank, world = part
            rows = np.array_split(np.arange(len(arrays[first.name])), world)[rank]
            arrays = {k: v[rows] for k, v in arrays.items()}
        return evaluate_data(
            self.model, arrays, self.outputs, self.meta, torch.device("cpu"), reduce,
            chunk_rows=self.config.trainer.eval_batch_size, gather=gather,
        )


def _predicted(output: Any, raw: torch.Tensor, m: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """One output's prediction columns: ``<output>_predictions`` and, for classifiers,
    probabilities; nulls in the rows ``keep`` leaves out."""
    kind = OUTPUTS[output.type]
    pred, prob = kind.predictions(output, raw)
    return kind.predicted(output, pred, prob, m, keep)


def _mc_dropout(
    model: Any, batch: dict[str, torch.Tensor], outputs: dict[str, Any], raw: dict[str, torch.Tensor], *, seed: int,
) -> dict[str, torch.Tensor]:
    """Monte Carlo dropout for ``outputs`` (``models/uncertainty.py``): their entries of
    ``raw`` replaced by the logits of the samples' mean probabilities; their variances."""
    from raylight.declarative.models.ecd import module_key
    from raylight.declarative.models.uncertainty import as_logits, mc_dropout

    with torch.no_grad():
        hidden = model.combined(batch)
    spread = {}
    for name, out in outputs.items():
        binary = not OUTPUTS[out.type].WIDE
        mean, var = mc_dropout(model.decoders[module_key(name)], hidden, out.decoder.mc_dropout_samples, seed=seed, binary=binary)
        raw[name], spread[name] = as_logits(mean, binary=binary), var
    return spread


def _column(values: torch.Tensor, keep: np.ndarray) -> np.ndarray:
    """A float (or a list of floats) per row; null in the rows ``keep`` leaves out."""
    col = np.full(len(keep), None, dtype=object)
    for row, value in zip(np.flatnonzero(keep), values.tolist(), strict=True):
        col[row] = value
    return col


def load_model(path: str) -> LoadedModel:
    """Load ``<output-directory>/model`` for prediction; needs no Ray."""
    return LoadedModel(path)

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

from raylight.data.blocks import BlockDataset
from raylight.declarative.config import ModelConfig
from raylight.declarative.lr_schedule import Plateau, Schedule, schedule_clock
from raylight.declarative.metrics import MINIMIZED

if TYPE_CHECKING:
    from raylight.context import TrainContext

TARGET_KEY = "__target__"

# trainer.optimizer.type -> its torch class (OptimizerConfig has their settings)
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "adadelta": torch.optim.Adadelta,
    "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam, "rmsprop": torch.optim.RMSprop,
}


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
        by row gives, without a Python call per row (``raylight.data.loader.fetch_batch``)."""
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
    model: torch.nn.Module, data: Any, output: Any, meta: dict[str, Any], device: torch.device,
    reduce: Callable[[dict[str, float]], dict[str, float]] | None = None, chunk_rows: int | None = None,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, float]:
    """Loss and metrics of ``model`` on ``data`` (arrays or object-store blocks), streamed
    ``chunk_rows`` rows at a time (trainer.eval_batch_size; None: EVAL_ROWS): sums over chunks,
    so nothing larger than a chunk is held at once, but for a binary output's scores and
    labels (ROC AUC ranks them all: 16 bytes a row). ``reduce`` adds up the sums, and
    ``gather`` concatenates the (score, label) rows, of every process that evaluated a part
    of the data."""
    from raylight.models import loss_for, predictions

    std = meta[output.name].get("std", 1.0)
    classifier = output.type in ("binary", "category")
    sums = dict.fromkeys(("n", "loss", "correct", "jaccard", "sse", "sae", "t", "t2"), 0.0)
    ranked: list[np.ndarray] = []  # binary: each chunk's (logit, label) rows
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for chunk in _chunks(data, chunk_rows or EVAL_ROWS):
            batch = {k: torch.from_numpy(np.array(v)).to(device) for k, v in chunk.items()}
            target = batch.pop(output.name)
            out = model(batch).cpu()
            target = target.cpu()
            n = len(target)
            if n == 0:
                continue
            sums["n"] += n
            sums["loss"] += float(loss_for(output.type)(out, target)) * n
            if output.type == "set":  # Ludwig's jaccard: |predicted & true| / |predicted | true| per row
                pred, _ = predictions(output.type, out, output.threshold)
                both, either = (pred.bool() & target.bool()).sum(1), (pred.bool() | target.bool()).sum(1)
                sums["jaccard"] += float(torch.where(either > 0, both / either.clamp(min=1), 1.0).sum())
            elif classifier:
                pred, _ = predictions(output.type, out, output.threshold)
                sums["correct"] += float((pred == target.long()).sum())
                if output.type == "binary":
                    ranked.append(torch.stack([out.double(), target.double()], dim=1).numpy())
            else:
                err = ((out - target) * std).double()
                scaled = (target * std).double()
                sums["sse"] += float(err.pow(2).sum())
                sums["sae"] += float(err.abs().sum())
                sums["t"] += float(scaled.sum())
                sums["t2"] += float(scaled.pow(2).sum())
    model.train(was_training)
    if reduce is not None:
        sums = reduce(sums)
    rows = sums["n"] or 1.0
    if output.type == "binary":
        scored = np.concatenate(ranked) if ranked else np.zeros((0, 2))
        scored = gather(scored) if gather is not None else scored
        return {"loss": sums["loss"] / rows, "accuracy": sums["correct"] / rows, "roc_auc": roc_auc(scored[:, 0], scored[:, 1])}
    if classifier:
        return {"loss": sums["loss"] / rows, "accuracy": sums["correct"] / rows}
    if output.type == "set":
        return {"loss": sums["loss"] / rows, "jaccard": sums["jaccard"] / rows}
    mse = sums["sse"] / rows
    var = (sums["t2"] / rows - (sums["t"] / rows) ** 2) or 1.0
    return {"loss": sums["loss"] / rows, "mse": mse, "mae": sums["sae"] / rows, "r2": 1.0 - mse / var}


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for the ``labels`` (1 positive): the
    chance a positive scores above a negative, ties counting half (Mann-Whitney's U over
    the counts of both); 0.5 where either class is absent (undefined)."""
    from scipy.stats import rankdata

    positive = labels == 1
    pos, neg = int(positive.sum()), int((~positive).sum())
    if pos == 0 or neg == 0:
        return 0.5
    ranks = rankdata(scores)  # ties: their average rank
    return float((ranks[positive].sum() - pos * (pos + 1) / 2) / (pos * neg))


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


class RateSchedule:
    """``trainer.learning_rate_scheduler`` applied to the loop's optimizer: each step's rate
    (and one_cycle's momentum) from the loader's position, reductions on plateau after each
    evaluation (raylight.declarative.lr_schedule has the math). Without the section, the
    rate stays ``base_lr``."""

    def __init__(self, cfg: ModelConfig, *, base_lr: float, batch_size: int, train_rows: int) -> None:
        section = cfg.trainer.learning_rate_scheduler
        self.batch_size = batch_size
        self.steps_per_epoch = math.ceil(train_rows / batch_size)
        # trainer.train_steps, Ludwig's budget in steps, else the epochs' steps
        self.budget = cfg.trainer.train_steps
        total = self.budget or cfg.trainer.epochs * self.steps_per_epoch
        self.epochs = math.ceil(total / self.steps_per_epoch)
        self.last = base_lr  # the rate of the last step taken
        self.schedule = self.plateau = None
        self.section = section
        if section is not None:
            self.schedule = Schedule(section, base_lr=base_lr, total_steps=total, steps_per_epoch=self.steps_per_epoch)
            if section.reduce_on_plateau > 0:
                self.plateau = Plateau(
                    limit=section.reduce_on_plateau, rate=section.reduce_on_plateau_rate,
                    patience=section.reduce_on_plateau_patience, metric=section.reduce_eval_metric,
                )

    def clock(self, loader: Any) -> int:
        """Steps (of the first batch) trained so far, from the loader's position."""
        return schedule_clock(loader.epoch, loader.cursor, self.batch_size, self.steps_per_epoch)

    def spent(self, loader: Any) -> bool:
        """Whether ``trainer.train_steps`` steps are done (never without the key)."""
        return self.budget is not None and self.clock(loader) >= self.budget

    def apply(self, opt: torch.optim.Optimizer, loader: Any) -> None:
        """Set the rate of the next step (every group, as Ludwig's scheduler does)."""
        self.last = opt.param_groups[0]["lr"]
        if self.schedule is None:
            return
        clock = self.clock(loader)
        rate = self.schedule.lr(clock) * (self.plateau.factor() if self.plateau is not None else 1.0)
        momentum = self.schedule.momentum(clock)
        for group in opt.param_groups:
            group["lr"] = rate
            if momentum is not None:  # one_cycle: SGD's momentum or Adam's first beta
                if "betas" in group:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum

    def evaluated(self, train_loss: float, validation: dict[str, float]) -> None:
        """Hear an epoch's evaluation (reduction on plateau)."""
        if self.plateau is None or self.section is None:
            return
        split, metric = self.section.reduce_eval_split, self.section.reduce_eval_metric
        self.plateau.step(train_loss if split == "training" else validation[metric])

    def state_dict(self) -> dict[str, Any] | None:
        return self.plateau.state_dict() if self.plateau is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.plateau is not None and state is not None:
            self.plateau.load_state_dict(state)


def declarative_loop(ctx: TrainContext, config: dict[str, Any]) -> None:
    """The per-worker loop raylight.fit runs for `raylight train`."""
    from raylight.models import build_model, loss_for

    cfg = ModelConfig.model_validate(config["model_config"])
    assert config["train"] is not None, "the training split is never empty"
    train_data, val_data = training_dataset(from_store(config["train"])), from_store(config["validation"])
    meta, out = config["meta"], cfg.output_features[0]
    torch.manual_seed(cfg.trainer.seed)
    model = ctx.prepare_model(build_model(cfg, meta))
    lr = config["learning_rate"]
    base = OPTIMIZERS[cfg.trainer.optimizer.type](model.parameters(), lr=lr, **cfg.trainer.optimizer.kwargs())
    opt = ctx.prepare_optimizer(base, max_grad_norm=cfg.trainer.gradient_clipping.clipglobalnorm)
    # best["metric"]: the best score so far, lower is better (a metric that improves as it
    # rises, accuracy or r2, is negated)
    best: dict[str, Any] = {"metric": math.inf, "epoch": -1, "state": None}
    sign = 1.0 if cfg.trainer.validation_metric in MINIMIZED else -1.0
    rates = RateSchedule(cfg, base_lr=lr, batch_size=config["batch_size"], train_rows=len(train_data))
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        best = state["best"]
        rates.load_state_dict(state.get("rates"))
    loader = ctx.prepare_loader(
        train_data,
        batch_size=config["batch_size"],
        shuffle=True,
        seed=cfg.trainer.seed,
        adaptive=config["adaptive"],
    )
    loss_fn = loss_for(out.type)
    penalty = regularization(cfg.trainer.regularization_type, cfg.trainer.regularization_lambda)
    stats = ctx.accumulator()
    for epoch in ctx.epochs(rates.epochs):
        rates.apply(opt, loader)
        for batch in loader if not rates.spent(loader) else ():
            target = batch.pop(out.name)
            opt.zero_grad()
            loss = loss_fn(model(batch), target)
            weighted = loss * out.loss_weight if out.loss_weight != 1 else loss  # Ludwig's loss.weight
            (weighted + penalty(model) if penalty is not None else weighted).backward()
            opt.step()
            rates.apply(opt, loader)  # after a step (the loader has moved on): the next one's rate
            stats[f"loss{epoch}"] += loss.item() * len(target)
            stats[f"n{epoch}"] += len(target)
            if rates.spent(loader):  # trainer.train_steps reached: the run ends with this epoch
                break
        with stats.synchronized():
            train_loss = stats[f"loss{epoch}"] / max(stats[f"n{epoch}"], 1)
        report: dict[str, Any] = {"epoch": epoch, "train_loss": train_loss, "batch_size": ctx.batch_size}
        val: dict[str, float] = {}
        if val_data is not None:  # every rank: the same numbers, the same decision
            val = evaluate_data(model, val_data, out, meta, ctx.device, chunk_rows=cfg.trainer.eval_batch_size)
            report.update({f"validation_{k}": v for k, v in val.items()})
            judged, score = val["loss"], sign * val[cfg.trainer.validation_metric]
        else:
            judged = score = train_loss
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
            "rates": rates.state_dict(),
        })
        if stop:
            break


MODEL_FILE, WEIGHTS_FILE, MODEL_FORMAT = "model.json", "weights.safetensors", 1


def save_model(path: str, config: ModelConfig, meta: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """``path``/weights.safetensors and ``path``/model.json (config + preprocessing)."""
    from safetensors.torch import save_file

    from raylight.storage import atomic_path, atomic_write

    os.makedirs(path, exist_ok=True)
    with atomic_path(os.path.join(path, WEIGHTS_FILE)) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
    # model.json last: a directory with it is a whole model.
    atomic_write(os.path.join(path, MODEL_FILE), json.dumps({"config": config.model_dump(mode="json"), "meta": meta, "format": MODEL_FORMAT}))


def _read_model_json(path: str, damaged: str) -> dict[str, Any]:
    from raylight.declarative.loading import read_text_file
    from raylight.exceptions import ConfigError

    try:
        saved = json.loads(read_text_file(path, "model file"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path!r} is not valid JSON ({exc}): {damaged}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) or not isinstance(saved.get("meta"), dict):
        raise ConfigError(f"{path!r} lacks its config and preprocessing metadata: {damaged}")
    return saved


def _build_checked(config: ModelConfig, meta: dict[str, Any], model_json: str, damaged: str) -> torch.nn.Module:
    """The model ``model.json`` describes; its metadata must hold what each feature needs."""
    from raylight.exceptions import ConfigError
    from raylight.models import build_model

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

    from raylight.exceptions import ConfigError

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
        from raylight.config.validation import validate
        from raylight.exceptions import ConfigError

        if not os.path.exists(path):
            raise ConfigError(f"model path {path!r} does not exist; pass <output-directory>/model of a trained run")
        if not os.path.isdir(path):
            raise ConfigError(f"model path {path!r} is a file; pass the model directory, <output-directory>/model")
        model_json = os.path.join(path, MODEL_FILE)
        if not os.path.exists(model_json):
            raise ConfigError(f"{path!r} is not a raylight model directory (no {MODEL_FILE}); pass <output-directory>/model")
        damaged = f"the model directory {path!r} is damaged or not raylight's; train again, or restore it from the run"
        saved = _read_model_json(model_json, damaged)
        fmt = saved.get("format", 1)
        if fmt != MODEL_FORMAT:
            raise ConfigError(
                f"{model_json!r} has format {fmt!r}; this raylight reads format {MODEL_FORMAT} "
                "(a model written by a newer raylight needs that version)"
            )
        self.config = validate(ModelConfig, saved["config"], prefix=f"{MODEL_FILE} config")
        self.meta = saved["meta"]
        self.model = _build_checked(self.config, self.meta, model_json, damaged)
        _load_weights(self.model, os.path.join(path, WEIGHTS_FILE), damaged)
        self.model.eval()
        self.output = self.config.output_features[0]

    def _arrays(self, df: pd.DataFrame, *, with_outputs: bool, source: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        from raylight.declarative.preprocess import check_columns, transform

        check_columns(df, self.config, with_outputs=with_outputs, source=source)
        return transform(df, self.config, self.meta, with_outputs=with_outputs)

    def predict(self, df: pd.DataFrame, *, source: str = "input") -> pd.DataFrame:
        """One row per input row, in order: ``<output>_predictions`` and, for
        classifiers, probabilities. Rows a drop_row strategy rejects get nulls.
        ``source`` names the data in error messages."""
        from raylight.models import predictions

        arrays, keep = self._arrays(df, with_outputs=False, source=source)
        out_name, kind = self.output.name, self.output.type
        result = pd.DataFrame(index=df.index)
        with torch.no_grad():
            raw = self.model({k: torch.from_numpy(v) for k, v in arrays.items()})
        pred, prob = predictions(kind, raw, self.output.threshold)
        col = np.full(len(df), None, dtype=object)
        m = self.meta[out_name]
        if kind == "category":
            col[keep] = [m["classes"][i] for i in pred.tolist()]
        elif kind == "binary":
            col[keep] = [bool(v) for v in pred.tolist()]
        elif kind == "set":
            for i, row in zip(np.flatnonzero(keep), pred.numpy(), strict=True):  # one list per row (not a 2-D array)
                col[i] = [m["classes"][j] for j in np.flatnonzero(row)]
        else:
            col[keep] = (pred.numpy() * m["std"] + m["mean"]).tolist()
        result[f"{out_name}_predictions"] = col
        if kind == "binary" and prob is not None:
            probs = np.full(len(df), np.nan)
            probs[keep] = prob.numpy()
            result[f"{out_name}_probabilities"] = probs
        elif kind in ("category", "set") and prob is not None:
            for j, cls in enumerate(m["classes"]):
                probs = np.full(len(df), np.nan)
                probs[keep] = prob[:, j].numpy()
                result[f"{out_name}_probability_{cls}"] = probs
        return result.reset_index(drop=True)

    def evaluate(
        self, df: pd.DataFrame, *, source: str = "input", part: tuple[int, int] | None = None,
        reduce: Callable[[dict[str, float]], dict[str, float]] | None = None,
        gather: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> dict[str, float]:
        """Metrics on ``df``; ``part=(rank, world_size)`` evaluates that share of its rows,
        ``reduce`` adds up every share's sums and ``gather`` joins a binary output's scores
        (processes a launcher started)."""
        from raylight.declarative.preprocess import check_target
        from raylight.exceptions import ConfigError

        arrays, _ = self._arrays(df, with_outputs=True, source=source)  # checks the columns first
        check_target(df, self.config, source)
        if len(arrays[self.output.name]) == 0:
            raise ConfigError(
                f"no rows to evaluate: every row of the {len(df)} given lacks the target "
                f"{self.output.col!r} or is dropped by a drop_row strategy"
            )
        if part is not None:
            rank, world = part
            rows = np.array_split(np.arange(len(arrays[self.output.name])), world)[rank]
            arrays = {k: v[rows] for k, v in arrays.items()}
        return evaluate_data(
            self.model, arrays, self.output, self.meta, torch.device("cpu"), reduce,
            chunk_rows=self.config.trainer.eval_batch_size, gather=gather,
        )


def load_model(path: str) -> LoadedModel:
    """Load ``<output-directory>/model`` for prediction; needs no Ray."""
    return LoadedModel(path)

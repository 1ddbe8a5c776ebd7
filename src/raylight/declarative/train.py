"""Training a declarative model with the core engine, then saving and evaluating it."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np
import pandas as pd
import torch

from raylight.config.declarative import ModelConfig

TARGET_KEY = "__target__"


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


def metrics_for(output_type: str, out: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> dict[str, float]:
    from raylight.models import loss_for, predictions

    loss = float(loss_for(output_type)(out, target))
    if output_type in ("binary", "category"):
        pred, _ = predictions(output_type, out)
        return {"loss": loss, "accuracy": float((pred == target.long()).float().mean())}
    std = meta.get("std", 1.0)
    err = (out - target) * std
    var = float(((target - target.mean()) * std).pow(2).mean()) or 1.0
    mse = float(err.pow(2).mean())
    return {"loss": loss, "mse": mse, "mae": float(err.abs().mean()), "r2": 1.0 - mse / var}


def evaluate_arrays(model: torch.nn.Module, arrays: dict[str, np.ndarray], output: Any, meta: dict[str, Any], device: torch.device) -> dict[str, float]:
    data = ArrayDataset(arrays)
    model.eval()
    with torch.no_grad():
        batch = {k: v.to(device) for k, v in data.arrays.items()}
        target = batch.pop(output.name)
        out = model(batch)
    model.train()
    return metrics_for(output.type, out.cpu(), target.cpu(), meta[output.name])


def declarative_loop(ctx: Any, config: dict[str, Any]) -> None:
    """The per-worker loop raylight.fit runs for `raylight train`."""
    from raylight.declarative.ray_data import gather
    from raylight.models import build_model, loss_for

    cfg = ModelConfig.model_validate(config["model_config"])
    train_arrays, val_arrays = gather(config["train"]), gather(config["validation"])
    assert train_arrays is not None, "the training split is never empty"
    meta, out = config["meta"], cfg.output_features[0]
    torch.manual_seed(cfg.trainer.seed)
    model = ctx.prepare_model(build_model(cfg, meta))
    lr = config["learning_rate"]
    opt_cfg = cfg.trainer.optimizer
    params = model.parameters()
    base: torch.optim.Optimizer
    if opt_cfg.type == "sgd":
        base = torch.optim.SGD(params, lr=lr, momentum=opt_cfg.momentum, weight_decay=opt_cfg.weight_decay)
    elif opt_cfg.type == "adamw":
        base = torch.optim.AdamW(params, lr=lr, weight_decay=opt_cfg.weight_decay)
    else:
        base = torch.optim.Adam(params, lr=lr, weight_decay=opt_cfg.weight_decay)
    opt = ctx.prepare_optimizer(base)
    best: dict[str, Any] = {"metric": math.inf, "epoch": -1, "state": None}
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        best = state["best"]
    loader = ctx.prepare_loader(
        ArrayDataset(train_arrays),
        batch_size=config["batch_size"],
        shuffle=True,
        seed=cfg.trainer.seed,
        adaptive=config["adaptive"],
    )
    loss_fn = loss_for(out.type)
    stats = ctx.accumulator()
    for epoch in ctx.epochs(cfg.trainer.epochs):
        for batch in loader:
            target = batch.pop(out.name)
            opt.zero_grad()
            loss = loss_fn(model(batch), target)
            loss.backward()
            opt.step()
            stats[f"loss{epoch}"] += loss.item() * len(target)
            stats[f"n{epoch}"] += len(target)
        with stats.synchronized():
            train_loss = stats[f"loss{epoch}"] / max(stats[f"n{epoch}"], 1)
        report: dict[str, Any] = {"epoch": epoch, "train_loss": train_loss, "batch_size": ctx.batch_size}
        if val_arrays is not None:  # every rank: the same numbers, the same decision
            val = evaluate_arrays(model, val_arrays, out, meta, ctx.device)
            report.update({f"validation_{k}": v for k, v in val.items()})
            metric = val["loss"]
        else:
            metric = train_loss
        if metric < best["metric"]:
            best = {"metric": metric, "epoch": epoch, "state": {k: v.detach().cpu().clone() for k, v in ctx.unwrap_model(model).state_dict().items()}}
        stop = cfg.trainer.early_stop >= 0 and epoch - best["epoch"] >= cfg.trainer.early_stop
        report["early_stop"] = stop
        ctx.report(report, checkpoint={"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict(), "best": best})
        if stop:
            break


def save_model(path: str, config: ModelConfig, meta: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """``path``/weights.safetensors and ``path``/model.json (config + preprocessing)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, ".weights.tmp")
    save_file({k: v.contiguous() for k, v in state.items()}, tmp)
    os.replace(tmp, os.path.join(path, "weights.safetensors"))
    with open(os.path.join(path, ".model.json.tmp"), "w") as f:
        json.dump({"config": config.model_dump(mode="json"), "meta": meta, "format": 1}, f)
    os.replace(os.path.join(path, ".model.json.tmp"), os.path.join(path, "model.json"))


class LoadedModel:
    """A trained declarative model: ``predict`` and ``evaluate`` in plain Python, no Ray."""

    def __init__(self, path: str) -> None:
        from safetensors.torch import load_file

        from raylight.exceptions import ConfigError
        from raylight.models import build_model

        model_json = os.path.join(path, "model.json")
        if not os.path.exists(model_json):
            raise ConfigError(f"{path!r} is not a raylight model directory (no model.json); pass <output-directory>/model")
        with open(model_json) as f:
            saved = json.load(f)
        self.config = ModelConfig.model_validate(saved["config"])
        self.meta = saved["meta"]
        self.model = build_model(self.config, self.meta)
        self.model.load_state_dict(load_file(os.path.join(path, "weights.safetensors")))
        self.model.eval()
        self.output = self.config.output_features[0]

    def _arrays(self, df: pd.DataFrame, *, with_outputs: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
        from raylight.declarative.preprocess import check_columns, transform

        check_columns(df, self.config, with_outputs=with_outputs, source="input")
        return transform(df, self.config, self.meta, with_outputs=with_outputs)

    def predict(self, df: pd.DataFrame) -> pd.DataFrame:
        """One row per input row, in order: ``<output>_predictions`` and, for
        classifiers, probabilities. Rows a drop_row strategy rejects get nulls."""
        from raylight.models import predictions

        arrays, keep = self._arrays(df, with_outputs=False)
        out_name, kind = self.output.name, self.output.type
        result = pd.DataFrame(index=df.index)
        with torch.no_grad():
            raw = self.model({k: torch.from_numpy(v) for k, v in arrays.items()})
        pred, prob = predictions(kind, raw)
        col = np.full(len(df), None, dtype=object)
        m = self.meta[out_name]
        if kind == "category":
            col[keep] = [m["classes"][i] for i in pred.tolist()]
        elif kind == "binary":
            col[keep] = [bool(v) for v in pred.tolist()]
        else:
            col[keep] = (pred.numpy() * m["std"] + m["mean"]).tolist()
        result[f"{out_name}_predictions"] = col
        if kind == "binary" and prob is not None:
            probs = np.full(len(df), np.nan)
            probs[keep] = prob.numpy()
            result[f"{out_name}_probabilities"] = probs
        elif kind == "category" and prob is not None:
            for j, cls in enumerate(m["classes"]):
                probs = np.full(len(df), np.nan)
                probs[keep] = prob[:, j].numpy()
                result[f"{out_name}_probability_{cls}"] = probs
        return result.reset_index(drop=True)

    def evaluate(self, df: pd.DataFrame) -> dict[str, float]:
        from raylight.declarative.preprocess import check_target

        check_target(df, self.config, "input")
        arrays, _ = self._arrays(df, with_outputs=True)
        return evaluate_arrays(self.model, arrays, self.output, self.meta, torch.device("cpu"))


def load_model(path: str) -> LoadedModel:
    """Load ``<output-directory>/model`` for prediction; needs no Ray."""
    return LoadedModel(path)

"""`raylight train / evaluate / predict / experiment / init-config / check`, as functions.

Everything that can be wrong with the input (config, dataset, columns, cluster,
resources) is checked before the output directory is created, so a bad input leaves
nothing half-written.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd

from raylight.config.declarative import ModelConfig
from raylight.config.loading import render_config
from raylight.declarative.dataset import read_pandas
from raylight.declarative.preprocess import (
    check_columns,
    check_target,
    fit_metadata,
    split_rows,
    transform,
)
from raylight.exceptions import ConfigError

log = logging.getLogger("raylight")

DEFAULT_LR = {"adam": 1e-3, "adamw": 1e-3, "sgd": 0.05}


@dataclass
class Backend:
    kind: str  # "local" or "ray"
    num_workers: int | tuple[int, int]
    use_gpu: bool
    resources: dict[str, float] | None


def resolve_backend(config: ModelConfig, override: str | None) -> Backend:
    """Which backend runs, with how many workers; connects to Ray for the ray backend and
    checks the resources it asks for exist."""
    b = config.backend
    kind = override or b.type
    if kind is None:
        import ray

        kind = "ray" if (os.environ.get("RAY_ADDRESS") or ray.is_initialized()) else "local"
    if kind not in ("local", "ray"):
        raise ConfigError(f"backend must be local or ray, got {kind!r}")
    t = b.trainer
    if kind == "local":
        return Backend("local", 0, t.use_gpu, None)
    import ray

    from raylight import runtime

    runtime.connect(None)
    total = ray.cluster_resources()
    per = dict(t.resources_per_worker or {})
    per.setdefault("CPU", 1.0)
    if t.use_gpu:
        per.setdefault("GPU", 1.0)
    if t.min_workers is not None or t.max_workers is not None:
        lo = t.min_workers or 1
        hi = t.max_workers or max(lo, int(total.get("CPU", 1) // per["CPU"]))
        workers: int | tuple[int, int] = (lo, hi)
        need = lo
    else:
        fits = int(min(total.get(k, 0.0) // v for k, v in per.items() if v > 0))
        workers = t.num_workers or max(1, fits)
        need = workers
    for key, amount in per.items():
        have = total.get(key, 0.0)
        if amount * need > have:
            raise ConfigError(
                f"backend.trainer asks for {need} workers x {key}: {amount:g} = {amount * need:g} {key}, "
                f"but the cluster has {have:g}; lower backend.trainer.num_workers"
                + (" or set backend.trainer.use_gpu: false" if key == "GPU" else "")
            )
    return Backend("ray", workers, t.use_gpu, per)


@dataclass
class Prepared:
    config: ModelConfig
    meta: dict[str, Any]
    # Each split: a dict of arrays, or BlockRefs (Ray Data: blocks left in the object store).
    train: Any
    validation: Any
    test: Any
    test_frame: pd.DataFrame | None


def prepare(
    config: ModelConfig, dataset: str, *, use_cache: bool = True, processor: str = "pandas", progress: bool = True
) -> Prepared:
    """Preprocessed splits, from ``backend.cache_dir`` when an entry matches. ``processor``
    "ray_data" leaves the splits in the object store as blocks (``BlockRefs``)."""
    cache_dir = config.backend.cache_dir if use_cache else None
    if cache_dir:
        from raylight.declarative import cache

        key = cache.cache_key(config, dataset, layout="blocks" if processor == "ray_data" else "arrays")
        hit = cache.load(cache_dir, key)
        if hit is not None:
            log.info("preprocessed data from the cache %s/%s", cache_dir, key)
            meta, splits = hit
            return Prepared(config, meta, splits["train"], splits["validation"], splits["test"], None)
    if processor == "ray_data":
        from raylight.declarative.ray_data import prepare_ray_data

        parts = prepare_ray_data(config, dataset, progress=progress)
        prepared = Prepared(config, parts["meta"], parts["train"], parts["validation"], parts["test"], None)
    else:
        prepared = _prepare(config, dataset)
    if cache_dir:
        cache.save(cache_dir, key, prepared.meta, {"train": prepared.train, "validation": prepared.validation, "test": prepared.test})
    return prepared


def _prepare(config: ModelConfig, dataset: str) -> Prepared:
    df = read_pandas(dataset)
    check_columns(df, config, with_outputs=True, source=dataset)
    check_target(df, config, dataset)
    probs = config.preprocessing.split.probabilities
    train_idx, val_idx, test_idx = split_rows(len(df), probs, config.trainer.seed)
    train_df = df.iloc[train_idx]
    meta = fit_metadata(train_df, config)
    train, _ = transform(train_df, config, meta, with_outputs=True)
    if len(next(iter(train.values()))) == 0:
        raise ConfigError(f"dataset {dataset!r}: no training rows are left after preprocessing (drop_row strategies)")
    val = transform(df.iloc[val_idx], config, meta, with_outputs=True)[0] if len(val_idx) else None
    test = transform(df.iloc[test_idx], config, meta, with_outputs=True)[0] if len(test_idx) else None
    return Prepared(config, meta, train, val, test, df.iloc[test_idx] if len(test_idx) else None)


def new_output_dir(path: str) -> str:
    """The absolute output directory, checked before anything is done: it does not exist
    yet, is empty, or holds only a failed attempt that never committed a checkpoint (which
    the new run replaces). Its parents are created when training starts."""
    from raylight.recorder import directory_state
    from raylight.storage import RunStorage

    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"--output-directory {path!r}: {parent!r} is a file, not a directory; choose another path")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--output-directory {path!r} is a file; choose a directory that does not exist yet")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--output-directory {path!r}: {parent!r} is not writable; choose another path")
    if os.path.isdir(path) and os.listdir(path) and directory_state(RunStorage(path)) != "replaceable":
        raise ConfigError(f"output directory {path!r} already exists and is not empty; choose another --output-directory")
    return path


def train(
    config: ModelConfig,
    dataset: str,
    *,
    output_directory: str,
    backend: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train, save the model to ``<output_directory>/model`` and evaluate on the test split."""
    import raylight
    from raylight.declarative.train import declarative_loop, evaluate_data, load_model, save_model

    out = new_output_dir(output_directory)
    resolved = resolve_backend(config, backend)
    if resolved.kind == "ray" and config.backend.processor.type == "ray_data":
        prepared = prepare(config, dataset, processor="ray_data", progress=progress)
    else:
        prepared = prepare(config, dataset)
    loop_config, adaptive = loop_settings(config, prepared, on_ray=resolved.kind == "ray")
    result = raylight.fit(  # creates the output directory when training starts
        declarative_loop,
        config=loop_config,
        num_workers=resolved.num_workers,
        adaptive=adaptive,
        use_gpu=resolved.use_gpu,
        resources_per_worker=resolved.resources,
        storage_path=os.path.dirname(out),
        name=os.path.basename(out),
        progress=progress,
    )
    with open(os.path.join(out, "config.yaml"), "w") as f:
        f.write(render_config(config))
    assert result.checkpoint is not None, "every epoch reports a checkpoint"
    best = result.checkpoint.load()["best"]
    model_dir = os.path.join(out, "model")
    save_model(model_dir, config, prepared.meta, best["state"])
    evaluation: dict[str, Any] = {"best_epoch": best["epoch"], "epochs_run": len(result.metrics_history)}
    if prepared.test is not None:
        import torch

        model = load_model(model_dir)
        evaluation["test"] = evaluate_data(model.model, prepared.test, model.output, prepared.meta, torch.device("cpu"))
    with open(os.path.join(out, "evaluation.json"), "w") as f:
        json.dump(evaluation, f, indent=2)
    _plot_learning_curves(result.metrics_history, os.path.join(out, "learning_curves.png"))
    return {"output_directory": out, "model_path": model_dir, "evaluation": evaluation, "backend": resolved.kind}


def loop_settings(config: ModelConfig, prepared: Prepared, *, on_ray: bool) -> tuple[dict[str, Any], Any]:
    """The declarative loop's config and the adaptive settings for one training run."""
    import raylight

    t = config.trainer
    auto_batch = t.batch_size == "auto"
    adaptive = t.adaptive
    if adaptive is None and auto_batch:
        rule = "adascale" if t.optimizer.type == "sgd" else "sqrt"
        adaptive = raylight.AdaptiveConfig(lr_rule=rule)
    if not on_ray and adaptive is not None:
        log.warning("trainer: the adaptive engine runs on the ray backend only; the local backend keeps batch %s", 64 if auto_batch else t.batch_size)
        adaptive = None
    loop_config = {
        "model_config": config.model_dump(mode="json"),
        "meta": prepared.meta,
        "train": prepared.train,
        "validation": prepared.validation,
        "learning_rate": DEFAULT_LR[t.optimizer.type] if t.learning_rate == "auto" else float(t.learning_rate),
        "batch_size": 64 if auto_batch else int(t.batch_size),
        "adaptive": adaptive is not None,
    }
    return loop_config, adaptive


def _plot_learning_curves(history: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    keys = [k for k in ("train_loss", "validation_loss") if any(k in h for h in history)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        ax.plot(epochs, [h.get(key, float("nan")) for h in history], marker="o", label=key)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def predict(model_path: str, dataset: str, output: str | None) -> pd.DataFrame:
    from raylight.declarative.train import load_model

    model = load_model(model_path)
    frame = model.predict(read_pandas(dataset))
    if output:
        write_frame(frame, output)
    return frame


def evaluate(model_path: str, dataset: str) -> dict[str, float]:
    from raylight.declarative.train import load_model

    return load_model(model_path).evaluate(read_pandas(dataset))


def write_frame(frame: pd.DataFrame, path: str) -> None:
    lower = path.lower()
    if lower.endswith(".csv"):
        frame.to_csv(path, index=False)
    elif lower.endswith(".parquet"):
        frame.to_parquet(path, index=False)
    elif lower.endswith(".jsonl"):
        frame.to_json(path, orient="records", lines=True)
    else:
        raise ConfigError(f"--output {path!r}: use a file ending in .csv, .parquet or .jsonl")


def init_config(dataset: str, target: str) -> dict[str, Any]:
    """A config whose feature types are inferred from the data."""
    df = read_pandas(dataset)
    if target not in df.columns:
        raise ConfigError(f"--target {target!r} is not a column of {dataset!r}; columns: {list(df.columns)}")

    def kind(col: pd.Series) -> str:
        values = col.dropna()
        if values.nunique() <= 2:
            return "binary"
        if pd.api.types.is_numeric_dtype(values):
            return "number" if values.nunique() > 20 else "category"
        mean_words = values.astype(str).str.split().str.len().mean()
        return "text" if mean_words > 3 else "category"

    inputs = [{"name": str(c), "type": kind(df[c])} for c in df.columns if c != target and not df[c].isna().all()]
    out_type = kind(df[target])
    if out_type == "text":
        out_type = "category"
    return {
        "input_features": inputs,
        "output_features": [{"name": target, "type": out_type}],
        "trainer": {"epochs": 10, "batch_size": "auto"},
    }

"""`raylight train / evaluate / predict / experiment / init-config / check`, as functions.

Everything that can be wrong with the input (config, dataset, columns, cluster,
resources) is checked before the output directory is created, so a bad input leaves
nothing half-written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from raylight.base.exceptions import ConfigError, TrainingDivergedError
from raylight.declarative import processor
from raylight.declarative.backends import (
    Backend,
    backend_kind,
    connect_while,
    launched_group,
    prestart,
    resolve_backend,
)
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.config.trainer import AUTO_BATCH_SIZE
from raylight.declarative.dataset import expand, read_pandas
from raylight.declarative.features import infer_type
from raylight.declarative.loading import render_config
from raylight.declarative.model_dir import check_model_dir
from raylight.declarative.outputs import OUTPUTS
from raylight.declarative.preprocess import (
    balance_block,
    balance_quotas,
    check_columns,
    check_hits_at_k,
    check_split_rows,
    check_target,
    check_validation_unneeded,
    class_counts,
    coded_split_rows,
    fit_metadata,
    missing_stratify_column,
    resolve_files,
    sample_rows,
    sample_size,
    split_rows,
    stratified_split_rows,
    transform,
)
from raylight.storage.run_dir import atomic_write

log = logging.getLogger("raylight")

# learning_rate: auto: each class's default in torch, but SGD's (torch's 0.001 is slow for it)
DEFAULT_LR = {
    "adam": 1e-3, "adamw": 1e-3, "sgd": 0.05, "adadelta": 1.0, "adagrad": 0.01, "adamax": 2e-3, "nadam": 2e-3, "rmsprop": 0.01,
    "radam": 1e-3, "adafactor": 1e-2, "muon": 1e-3, "schedule_free_adamw": 0.0025, "lbfgs": 1.0,
}


@dataclass
class Prepared:
    config: ModelConfig
    meta: dict[str, Any]
    # Each split: a dict of arrays, or BlockRefs (Ray Data: blocks left in the object store).
    train: Any
    validation: Any
    test: Any
    test_frame: pd.DataFrame | None
    # Rows of the training split, counted while it is in this process: in_store's copy
    # holds an object-store reference, which has no length (counted here, kept by replace).
    train_rows: int = -1

    def __post_init__(self) -> None:
        if self.train_rows < 0:
            self.train_rows = _train_rows(self.train)


def prepare(
    config: ModelConfig, dataset: str, *, use_cache: bool = True, processor: str = "pandas", progress: bool = True,
    write_cache: bool = True,
) -> Prepared:
    """Preprocessed splits, from ``backend.cache_dir`` when an entry matches. ``processor``
    "ray_data" leaves the splits in the object store as blocks (``BlockRefs``).
    ``write_cache``: store a new entry (rank 0 alone does, under a launcher)."""
    cache_dir = config.backend.cache_dir if use_cache else None
    if cache_dir:
        from raylight.declarative import cache

        key = cache.cache_key(config, dataset, layout="blocks" if processor == "ray_data" else "arrays")
        hit = cache.load(cache_dir, key)
        if hit is not None:
            log.info("preprocessed data from the cache %s/%s", cache_dir, key)
            meta, splits = hit
            check_hits_at_k(config, meta)
            return Prepared(config, meta, splits["train"], splits["validation"], splits["test"], None)
    if processor == "ray_data":
        from raylight.declarative.ray_data import prepare_ray_data


        parts = prepare_ray_data(config, dataset, progress=progress)
        prepared = Prepared(config, parts["meta"], parts["train"], parts["validation"], parts["test"], None)
    else:
        prepared = _prepare(config, dataset)
    check_hits_at_k(config, prepared.meta)
    if cache_dir and write_cache:
        cache.save(cache_dir, key, prepared.meta, {"train": prepared.train, "validation": prepared.validation, "test": prepared.test})
    return prepared


def _prepare(config: ModelConfig, dataset: str) -> Prepared:
    df = resolve_files(read_pandas(dataset), config, dataset)
    sample = sample_size(config.preprocessing, len(df), dataset)
    if sample < len(df):  # Ludwig's sample_ratio / sample_size: before anything else
        df = df.iloc[sample_rows(len(df), sample, (config.trainer.seed, 3))].reset_index(drop=True)
    check_columns(df, config, with_outputs=True, source=dataset)
    check_target(df, config, dataset)
    split = config.preprocessing.split
    probs = split.probabilities
    if split.coded_column is not None:
        train_idx, val_idx, test_idx = coded_split_rows(df, split, dataset)
        if split.type == "fixed":
            probs = (1.0, 0.0, 0.0)  # the column decides; training needs rows (checked below)
    elif split.type == "stratify":
        assert split.column is not None  # the config requires it
        if split.column not in df.columns:
            raise missing_stratify_column(split.column, dataset, list(df.columns))
        train_idx, val_idx, test_idx = stratified_split_rows(df[split.column], probs, config.trainer.seed)
    else:
        train_idx, val_idx, test_idx = split_rows(len(df), probs, config.trainer.seed)
    train_df = df.iloc[train_idx]
    meta = fit_metadata(train_df, config)
    splits = {
        name: transform(df.iloc[idx], config, meta, with_outputs=True)[0]
        for name, idx in (("train", train_idx), ("validation", val_idx), ("test", test_idx))
    }
    kept = {name: len(next(iter(arrays.values()))) for name, arrays in splits.items()}
    check_split_rows(dataset, len(df), kept, probs)
    if split.fixed_column is not None and kept["validation"] == 0:
        check_validation_unneeded(config, f"the fixed split's column {split.fixed_column!r} gives the validation split no rows")
    prep, seed = config.preprocessing, config.trainer.seed
    if prep.balancing:  # Ludwig's oversample_minority / undersample_majority: the training rows only
        target, over = config.output_features[0].name, prep.oversample_minority is not None
        counts = class_counts(splits["train"], target)[None]
        minority, quotas = balance_quotas(counts, prep.oversample_minority, prep.undersample_majority, (seed, 4))
        splits["train"] = balance_block(splits["train"], target, minority, quotas[0], over, (seed, 4, 0))
    train, val, test = (splits[k] if kept[k] else None for k in ("train", "validation", "test"))
    return Prepared(config, meta, train, val, test, df.iloc[test_idx] if kept["test"] else None)


def new_output_dir(path: str, *, resume: bool = False) -> str:
    """The absolute output directory, checked before anything is done: it does not exist
    yet, is empty, or holds only a failed attempt that never committed a checkpoint (which
    the new run replaces). Its parents are created when training starts. ``resume``
    (``--resume``): it holds a run that has not finished (a killed one), which continues
    from its last checkpoint."""
    from raylight.driver.recorder import directory_state
    from raylight.storage.run_dir import RunStorage

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
    state = directory_state(RunStorage(path)) if os.path.isdir(path) and os.listdir(path) else "absent"
    checkpoints = RunStorage(path).list_checkpoints() if state == "kept" else []
    finished = os.path.exists(os.path.join(path, "model"))  # saved once training ended
    if resume:
        if state == "absent":
            raise ConfigError(f"--resume: output directory {path!r} holds no run to continue; drop --resume to start one there")
        if finished:
            raise ConfigError(
                f"--resume: output directory {path!r} holds a finished run (its model is in {os.path.join(path, 'model')}); "
                "there is nothing to continue: choose another --output-directory to train again"
            )
        if state == "kept" and not checkpoints:
            raise ConfigError(
                f"--resume: output directory {path!r} is not a run directory (no checkpoints, config.json or "
                "metrics.jsonl); choose the --output-directory of the run to continue"
            )
        return path
    if state == "kept" and checkpoints and not finished:
        raise ConfigError(
            f"output directory {path!r} holds a run that did not finish (last checkpoint: {checkpoints[-1].index}); "
            "pass --resume to continue it from there, or choose another --output-directory"
        )
    if state == "kept":
        raise ConfigError(f"output directory {path!r} already exists and is not empty; choose another --output-directory")
    return path



def train(
    config: ModelConfig,
    dataset: str,
    *,
    output_directory: str,
    backend: str | None = None,
    progress: bool = True,
    prices: dict[str, float] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train, save the model to ``<output_directory>/model`` and evaluate on the test split.
    ``prices`` (USD per hour per node type) prices the run: the result's ``cost``.
    ``resume``: continue the unfinished (killed) run in ``output_directory`` from its last
    checkpoint, at its exact data position; the config and dataset must be the run's."""
    from raylight.worker import process_group

    launch = process_group.detect()
    leader = launch is None or launch.rank == 0  # under a launcher, rank 0 alone writes the output directory
    out = new_output_dir(output_directory, resume=resume) if leader else os.path.abspath(output_directory)
    expand(dataset)  # a missing or unreadable path is named before Ray starts
    if config.trainer.use_mixed_precision:  # GPUs are refused by the config
        log.info("trainer.use_mixed_precision: the workers train on CPUs, in full precision (as Ludwig's do there)")
    started = time.monotonic()
    choice = processor.resolve(config.backend.processor, backend_kind(config, backend), dataset)

    def preprocess() -> Prepared:
        return prepare(config, dataset, processor=choice.processor, progress=progress, write_cache=leader)

    _announce_start(config, backend, choice.processor, dataset, progress=progress)
    if choice.processor == "ray_data":  # on Ray: after connecting
        resolved = resolve_backend(config, backend)
        connect_s = time.monotonic() - started
        prepared = preprocess()
    else:  # while Ray's processes start, if it starts them
        resolved, connect_s, prepared = connect_while(preprocess, config, backend, connected=lambda b: prestart(b, config))
    if resolved.kind == "ray":
        prepared = in_store(prepared)
    preprocessed = time.monotonic()
    # torch only now: the ray backend's start began importing it in a thread while Ray's
    # processes started, and preprocessing overlapped it (an import up front serialises it).
    import raylight.driver.trainer  # noqa: F401  (_fit's, timed here as an import)
    from raylight.declarative.train import (
        calibrate_state,
        evaluate_data,
        finish_meta,
        load_model,
        save_model,
    )

    imported = time.monotonic()
    result, loop_config = _fit(config, prepared, resolved, out, progress=progress, prices=prices, resume=resume)
    if not leader:
        return {"output_directory": out, "model_path": os.path.join(out, "model"), "backend": resolved.kind, "rank": resolved.rank}
    atomic_write(os.path.join(out, "config.yaml"), render_config(config))
    best = _best(result, out, loop_config["learning_rate"])
    model_dir = os.path.join(out, "model")
    # Ludwig's calibration (decoder.calibration), fitted after training, before the model is saved
    state = calibrate_state(config, prepared.meta, best["state"], prepared.validation, prepared.train)
    # what an output fits after training (an anomaly output's radius and threshold), kept with the model
    save_model(model_dir, config, finish_meta(config, prepared.meta, state, prepared.validation, prepared.train), state)
    trained = time.monotonic()
    evaluation: dict[str, Any] = {
        "best_epoch": best["epoch"],
        "epochs_run": len(result.metrics_history),
        # Where the time went: connecting to (or starting) Ray, preprocessing (and putting
        # the arrays into the object store), what was left of importing torch, fit()
        # (worker start-up included).
        # connect and preprocess overlap, except with the ray_data processor: preprocess
        # is the time from the start to the arrays in place less connect's.
        "seconds": {
            "connect": connect_s, "preprocess": preprocessed - started - connect_s,
            "imports": imported - preprocessed, "train": trained - imported,
        },
        "processor": choice.processor,
    }
    if prepared.test is not None:
        import torch

        model = load_model(model_dir)
        evaluation["test"] = evaluate_data(
            model.model, prepared.test, model.outputs, model.meta, torch.device("cpu"), chunk_rows=config.trainer.eval_batch_size
        )
    atomic_write(os.path.join(out, "evaluation.json"), json.dumps(evaluation, indent=2))
    _plot_learning_curves(result.metrics_history, os.path.join(out, "learning_curves.png"))
    return {
        "output_directory": out, "model_path": model_dir, "evaluation": evaluation, "backend": resolved.kind,
        "cost": result.cost,
    }


def _announce_start(config: ModelConfig, backend: str | None, processor: str, dataset: str, *, progress: bool) -> None:
    """On a terminal, the line for the seconds before the first epoch: Ray starting (and
    the preprocessing beside it)."""
    if not progress or backend_kind(config, backend) != "ray":
        return
    from raylight.driver import runtime
    from raylight.driver.progress import announce

    if runtime.would_start_embedded(None):
        beside = f" while preprocessing {os.path.basename(dataset.rstrip('/'))}" if processor != "ray_data" else ""
        announce(f"starting Ray (a local cluster on this machine){beside}...")


def _fit(
    config: ModelConfig, prepared: Prepared, resolved: Backend, out: str, *, progress: bool,
    prices: dict[str, float] | None, resume: bool,
) -> tuple[Any, dict[str, Any]]:
    """The training run itself: the declarative loop on the core's Trainer (which creates
    the output directory when training starts). Its result, and the loop's config."""
    from raylight.declarative.train import check_sharding, declarative_loop
    from raylight.driver.trainer import Trainer, fit_config

    check_sharding(config, prepared.meta, num_workers=resolved.num_workers)  # before any worker
    loop_config, adaptive = loop_settings(config, prepared, on_ray=resolved.kind == "ray")
    trainer_config = fit_config(
        num_workers=resolved.num_workers,
        adaptive=adaptive,
        use_gpu=resolved.use_gpu,
        resources_per_worker=resolved.resources,
        strategy=config.backend.trainer.strategy,
        storage_path=os.path.dirname(out),
        name=os.path.basename(out),
        progress=progress,
        loggers=list(config.loggers),
        prices=prices,
        max_failures=config.backend.trainer.max_failures,
        resume=resume,
    )
    result = Trainer(
        declarative_loop, train_loop_config=loop_config, config=trainer_config,
        max_failures_setting="backend.trainer.max_failures",
    ).fit()
    return result, loop_config


def _best(result: Any, out: str, learning_rate: float) -> dict[str, Any]:
    """The best epoch's model (its checkpoint's ``best``); a run whose every epoch
    diverged is a TrainingDivergedError, one that diverged after a best epoch a warning."""
    assert result.checkpoint is not None, "every epoch reports a checkpoint"
    best: dict[str, Any] = result.checkpoint.load()["best"]
    if best["state"] is None:  # no epoch had a finite loss
        last = result.metrics_history[-1] if result.metrics_history else {}
        raise TrainingDivergedError(
            f"training diverged: the {'validation' if 'validation_loss' in last else 'training'} loss "
            f"was NaN or infinite from epoch {last.get('epoch', 0)} on, so there is no model to save "
            f"(the run is in {out}). Lower trainer.learning_rate (it was "
            f"{learning_rate:g}), or check the data for extreme values."
        )
    if result.metrics_history and result.metrics_history[-1].get("diverged"):
        log.warning(
            "training diverged at epoch %s (loss NaN or infinite) and stopped; the model saved is "
            "the one of epoch %s, the best before it", result.metrics_history[-1].get("epoch"), best["epoch"],
        )
    return best


def in_store(prepared: Prepared) -> Prepared:
    """The training and validation arrays put into Ray's object store once: the loop
    config then carries references, not the arrays, to every worker start and in-place
    resize (blocks from Ray Data are there already). Needs a connected Ray."""
    import dataclasses

    import ray

    def put(split: Any) -> Any:
        return ray.put(split) if isinstance(split, dict) else split

    return dataclasses.replace(prepared, train=put(prepared.train), validation=put(prepared.validation))


def loop_settings(config: ModelConfig, prepared: Prepared, *, on_ray: bool) -> tuple[dict[str, Any], Any]:
    """The declarative loop's config and the adaptive settings for one training run."""
    from raylight.config import AdaptiveConfig

    t = config.trainer
    auto_batch = t.batch_size == "auto"
    adaptive = t.adaptive
    if adaptive is None and auto_batch:
        rule = "adascale" if t.optimizer.type == "sgd" else "sqrt"
        adaptive = AdaptiveConfig(lr_rule=rule)
    if not on_ray and adaptive is not None:
        log.warning(
            "trainer: the adaptive engine runs on the ray backend only; training here keeps batch %s",
            AUTO_BATCH_SIZE if auto_batch else t.batch_size,
        )
        adaptive = None
    batch = AUTO_BATCH_SIZE if auto_batch else int(t.batch_size)
    rows = prepared.train_rows
    if not auto_batch and 0 < rows < batch:  # a valid input: one batch of every row
        log.warning(
            "trainer.batch_size %d is larger than the %d rows of the training split; training with "
            "batch_size %d (the whole split each step). Set trainer.batch_size to at most %d to choose it yourself",
            batch, rows, rows, rows,
        )
        batch = rows
    loop_config = {
        "model_config": config.model_dump(mode="json"),
        "meta": prepared.meta,
        "train": prepared.train,
        "validation": prepared.validation,
        "learning_rate": DEFAULT_LR[t.optimizer.type] if t.learning_rate == "auto" else float(t.learning_rate),
        "batch_size": batch,
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
    from raylight.storage.run_dir import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def _train_rows(train: Any) -> int:
    """Rows of the training split as preprocessed (a frame, a dict of arrays, Ray Data's
    ``BlockRefs``); 0 where they cannot be counted here (an object-store reference)."""
    if isinstance(train, dict):
        train = next(iter(train.values()), ())
    try:
        return len(train)
    except TypeError:
        return 0


def predict(model_path: str, dataset: str, output: str | None) -> pd.DataFrame | None:
    """Predictions for every row of ``dataset``, in order. Under a launcher each process
    predicts its share of the rows and rank 0 writes (and returns) them all; the other
    ranks return None."""
    check_model_dir(model_path)  # the files, before torch is imported: a broken model is named at once
    expand(dataset)
    if output:
        check_output_file(output, "--output", FRAME_FORMATS)
    from raylight.declarative.train import load_model

    model = load_model(model_path)
    df = resolve_files(read_pandas(dataset), model.config, dataset)
    with launched_group() as launch:
        if launch is None:
            frame = model.predict(df, source=dataset)
        else:
            import numpy as np
            import torch.distributed as dist

            rows = np.array_split(np.arange(len(df)), launch.world_size)[launch.rank]
            parts: list[Any] = [None] * launch.world_size
            dist.all_gather_object(parts, model.predict(df.iloc[rows], source=dataset))
            if launch.rank != 0:
                return None
            frame = pd.concat(parts)
    if output:
        write_frame(frame, output)
    return frame


FRAME_FORMATS = (".csv", ".parquet", ".jsonl")


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Before any work: ``path`` can be written as a new file (its directory exists, it
    is not a directory itself, its suffix names a format we write)."""
    if suffixes is not None and not path.lower().endswith(suffixes):
        raise ConfigError(f"{option} {path!r}: use a file ending in {', '.join(suffixes[:-1])} or {suffixes[-1]}")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path!r} is a directory; give a file name")
    if not os.path.isdir(parent):
        what = "is a file" if os.path.exists(parent) else "does not exist"
        raise ConfigError(f"{option} {path!r}: its directory {parent!r} {what}; create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{option} {path!r}: its directory {parent!r} is not writable")


def evaluate(model_path: str, dataset: str) -> dict[str, float] | None:
    """Metrics of the model on ``dataset``. Under a launcher each process evaluates its
    share of the rows, the sums are added up, and rank 0 returns the metrics (the other
    ranks None)."""
    check_model_dir(model_path)  # the files, before torch is imported: a broken model is named at once
    expand(dataset)
    from raylight.declarative.train import load_model

    model = load_model(model_path)
    df = resolve_files(read_pandas(dataset), model.config, dataset)
    with launched_group() as launch:
        if launch is None:
            return model.evaluate(df, source=dataset)
        import torch
        import torch.distributed as dist

        def reduce(sums: dict[str, float]) -> dict[str, float]:
            values = torch.tensor(list(sums.values()), dtype=torch.float64)
            dist.all_reduce(values)
            return dict(zip(sums, values.tolist(), strict=True))

        def gather(rows: Any) -> Any:
            import numpy as np

            parts: list[Any] = [None] * launch.world_size
            dist.all_gather_object(parts, rows)
            return np.concatenate(parts)

        metrics = model.evaluate(df, source=dataset, part=(launch.rank, launch.world_size), reduce=reduce, gather=gather)
        return metrics if launch.rank == 0 else None


def csv_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each list cell (a set output's labels) written as a set is read: its
    items separated by spaces; JSON lines and Parquet keep the lists."""
    listed = [c for c in frame.columns if frame[c].map(lambda v: isinstance(v, list)).any()]
    return frame.assign(**{c: frame[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, list) else v) for c in listed})


def write_frame(frame: pd.DataFrame, path: str) -> None:
    """Write ``frame`` whole or not at all (a temporary file renamed into place)."""
    check_output_file(path, "--output", FRAME_FORMATS)
    from raylight.storage.run_dir import atomic_path

    lower = path.lower()
    with atomic_path(path) as tmp:
        if lower.endswith(".csv"):
            csv_ready(frame).to_csv(tmp, index=False)
        elif lower.endswith(".parquet"):
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_json(tmp, orient="records", lines=True)


def init_config(dataset: str, target: str, output: str | None = None) -> dict[str, Any]:
    """A config whose feature types are inferred from the data (checking first that
    ``output``, where it will be written, can be)."""
    if output:
        check_output_file(output, "--output")
    df = read_pandas(dataset)
    if target not in df.columns:
        raise ConfigError(f"--target {target!r} is not a column of {dataset!r}; columns: {list(df.columns)}")

    inputs = [{"name": str(c), "type": infer_type(df[c].dropna())} for c in df.columns if c != target and not df[c].isna().all()]
    out_type = infer_type(df[target].dropna())
    if out_type not in OUTPUTS:  # text, say: its values as classes
        out_type = "category"
    return {
        "input_features": inputs,
        "output_features": [{"name": target, "type": out_type}],
        "trainer": trainer_for(len(df)),
    }


ADAPTIVE_FROM_ROWS = 10_000  # init-config: from here on, batch_size auto and 10 epochs
INIT_STEPS = 500  # below it: about this many optimizer steps, whatever the dataset's size


def trainer_for(rows: int) -> dict[str, Any]:
    """init-config's trainer section for a dataset of ``rows`` rows. A large one starts at
    the auto batch and lets the adaptive engine grow it; on a small one (sklearn's wine: 178
    rows) 10 epochs of batch 64 are 20 steps, which leaves the model far from trained, so it
    gets a fixed batch of about an eighth of its training split (16 to 128) and the epochs for
    about ``INIT_STEPS`` steps (10 to 100), stopped early when validation stops improving."""
    if rows >= ADAPTIVE_FROM_ROWS:
        return {"epochs": 10, "batch_size": "auto"}
    train = max(1, int(rows * 0.7))  # the default split's training share
    batch = int(min(128, max(16, 2 ** round(math.log2(max(train / 8, 1))))))
    epochs = min(100, max(10, math.ceil(INIT_STEPS / math.ceil(train / batch))))
    return {"epochs": epochs, "batch_size": batch, "early_stop": 10}

"""`raylight hyperopt`: a declarative search on Ray Tune, each trial a raylight run.

Order of work: validate the config and the dataset, connect to Ray, size the trials
and check they can ever be placed (fail fast with the numbers, where Tune would wait
forever), preprocess once, or once for each preprocessing the parameters give (on Ray
Data or pandas; finished before any trial claims CPUs), then run the Tuner with as many
trials at once as fit. Only then is the output directory written: the trials under
``tune/``, ``results.csv``/``results.json``, ``best_config.yaml`` (ready for ``raylight
train``) and ``hyperopt.png``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from raylight.base import verbosity
from raylight.base.exceptions import ConfigError, RaylightError
from raylight.config.schema import default_worker_resources
from raylight.declarative import processor, search
from raylight.declarative.config.hyperopt import HyperoptConfig
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.config.parameters import preprocessing_sections, set_path, space_values
from raylight.storage.run_dir import atomic_path, atomic_write
from raylight.tune.resources import (
    ConcurrencyPlan,
    check_bundles_fit,
    cluster_view,
    plan_concurrency,
    total,
    trial_bundles,
)

log = logging.getLogger("raylight")


@dataclass(frozen=True)
class TrialShape:
    """One trial: its workers and the bundles it asks for."""

    num_workers: int
    per_worker: dict[str, float]
    use_gpu: bool
    bundles: list[dict[str, float]]
    setting: str  # the settings that size it, for error messages


def trial_shape(config: ModelConfig) -> TrialShape:
    """Workers per trial and their resources, from backend.trainer and
    hyperopt.executor.{cpu,gpu}_resources_per_trial (pure)."""
    h = config.hyperopt
    assert h is not None
    t = config.backend.trainer
    ex = h.executor
    use_gpu = t.use_gpu or ex.gpu_resources_per_trial > 0
    per = default_worker_resources(t.resources_per_worker, use_gpu=use_gpu)
    cpw = per["CPU"]
    if t.num_workers is not None:
        workers = t.num_workers
        if ex.cpu_resources_per_trial is not None and not math.isclose(ex.cpu_resources_per_trial, workers * cpw):
            raise ConfigError(
                f"hyperopt.executor.cpu_resources_per_trial={ex.cpu_resources_per_trial:g} disagrees with "
                f"backend.trainer.num_workers={workers} x {cpw:g} CPU per worker = {workers * cpw:g}; "
                "set only one of them"
            )
    elif ex.cpu_resources_per_trial is not None:
        if cpw <= 0 or ex.cpu_resources_per_trial < cpw:
            raise ConfigError(
                f"hyperopt.executor.cpu_resources_per_trial={ex.cpu_resources_per_trial:g} is less than one "
                f"worker's {cpw:g} CPU (backend.trainer.resources_per_worker); raise it"
            )
        workers = int(ex.cpu_resources_per_trial // cpw)
    else:
        workers = 1
    if ex.gpu_resources_per_trial > 0:
        per["GPU"] = ex.gpu_resources_per_trial / workers
    per = {k: v for k, v in per.items() if v > 0}
    bundles = trial_bundles(num_workers=workers, resources_per_worker=per, cpus_per_worker=cpw)
    setting = "backend.trainer.num_workers, backend.trainer.resources_per_worker or hyperopt.executor.cpu_resources_per_trial"
    if use_gpu:
        setting += " / gpu_resources_per_trial"
    return TrialShape(workers, per, use_gpu, bundles, setting)


def plan(config: ModelConfig, cluster: dict[str, float], nodes: list[dict[str, float]]) -> tuple[TrialShape, ConcurrencyPlan]:
    """The trial's shape and how many run at once on a cluster (pure)."""
    h = config.hyperopt
    assert h is not None
    shape = trial_shape(config)
    check_bundles_fit(shape.bundles, nodes, shape.setting)
    concurrency = plan_concurrency(
        per_trial=total(shape.bundles),
        cluster=cluster,
        nodes=nodes,
        num_trials=search.num_trials(h),
        requested=h.executor.max_concurrent_trials,
        setting=shape.setting,
    )
    return shape, concurrency


def trial_config(base: dict[str, Any], sampled: dict[str, Any], own: dict[str, dict[str, Any]] | None = None) -> ModelConfig:
    """The model config of one trial: ``base`` with each sampled dotted key set. ``own``:
    what the config as written set itself (``ModelConfig._own``), which Ludwig's
    feature-level parameters (``defaults.<type>...``) leave alone; they go first, so that a
    feature's own parameter (``title.encoder.num_filters``) wins over its type's, as in Ludwig."""
    data = dict(base)
    for key, value in sorted(sampled.items(), key=lambda kv: not kv[0].startswith("defaults.")):
        data = set_path(data, key, value, own)
    data.pop("hyperopt", None)
    return ModelConfig.model_validate(data)


def preprocessing_key(config: ModelConfig) -> str:
    """Equal for two configs exactly when they preprocess the dataset alike."""
    return json.dumps(preprocessing_sections(config.model_dump(mode="json")), sort_keys=True)


def preprocessing_variants(config: ModelConfig) -> list[ModelConfig]:
    """The configs whose preprocessings the trials need: the search's own config when no
    parameter changes preprocessing; else, with the other parameters at the config's
    values, one for each combination of the values of those that do (ModelConfig's check
    finds them, gives them finite spaces and caps their number)."""
    h = config.hyperopt
    assert h is not None
    base, own = config.model_dump(mode="json"), config._own
    changing = {key: space_values(h.parameters[key]) for key in h._preprocessed}
    variants: dict[str, ModelConfig] = {}
    for combination in itertools.product(*changing.values()):  # one empty combination: the config's own
        variant = trial_config(base, dict(zip(changing, combination, strict=True)), own) if changing else config
        variants.setdefault(preprocessing_key(variant), variant)
    return list(variants.values())


def _declarative_trial(
    sampled: dict[str, Any], *, base: dict[str, Any], own: dict[str, dict[str, Any]], prepared: dict[str, Any],
    shape: TrialShape,
) -> None:
    """One trial, inside Tune: the sampled config trains on the trial's workers, from the
    data preprocessed as its config says (``prepared``: by ``preprocessing_key``)."""
    from raylight.config import FailureConfig, RunConfig, ScalingConfig, TrainerConfig
    from raylight.declarative.api import loop_settings
    from raylight.declarative.train import declarative_loop
    from raylight.tune.trial import run_trial

    config = trial_config(base, sampled, own)
    loop_config, adaptive = loop_settings(config, prepared[preprocessing_key(config)], on_ray=True)
    trainer_config = TrainerConfig(
        scaling=ScalingConfig(
            num_workers=shape.num_workers,
            use_gpu=shape.use_gpu,
            resources_per_worker=shape.per_worker,
            strategy=config.backend.trainer.strategy,
        ),
        run=RunConfig(progress=False),
        failure=FailureConfig(max_failures=config.backend.trainer.max_failures),
        adaptive=adaptive,
    )
    run_trial(declarative_loop, loop_config, trainer_config)


def hyperopt(
    config: ModelConfig, dataset: str, *, output_directory: str, progress: bool = True, resume: bool = False
) -> dict[str, Any]:
    """Run the search of ``config.hyperopt`` on ``dataset``; returns the output paths,
    the best trial's parameters and metric. ``resume`` (``--resume``): continue the
    search in ``output_directory`` that was cut short (Tune's restore of the experiment:
    finished trials are kept, unfinished and errored ones continue from their last
    checkpoint, the last epoch they reported); the config and dataset must be the search's."""
    from ray import tune

    from raylight.declarative import api
    from raylight.declarative.dataset import read_pandas
    from raylight.declarative.preprocess import check_columns, check_target
    h = config.hyperopt
    if h is None:
        raise ConfigError(
            "the config has no hyperopt: section; add one, e.g. hyperopt: {parameters: "
            "{trainer.learning_rate: {space: loguniform, lower: 0.0001, upper: 0.1}}}"
        )
    from raylight.worker import process_group

    if (launch := process_group.detect()) is not None:
        raise ConfigError(
            f"hyperopt runs its trials on Ray, but {launch.launcher} started this process; run "
            "`raylight hyperopt ...` without the launcher"
        )
    if config.backend.type not in (None, "ray"):
        log.warning("backend.type: %s is ignored by hyperopt; every trial runs its workers on Ray", config.backend.type)
    out = _resumable_dir(output_directory) if resume else api.new_output_dir(output_directory)
    search.search_algorithm(h)  # optuna missing is a usage error, before any work
    frame = read_pandas(dataset)
    check_columns(frame, config, with_outputs=True, source=dataset)
    check_target(frame, config, dataset)
    del frame
    _connect(out)
    cluster, nodes = cluster_view()
    shape, concurrency = plan(config, cluster, nodes)
    log.info("hyperopt: %d worker(s) per trial, %s", shape.num_workers, concurrency.reason)
    # Preprocess before any trial holds CPUs (Ray Data needs them free): once, or once for
    # each preprocessing the searched parameters give.
    choice = processor.resolve(config.backend.processor, "ray", dataset)
    variants = preprocessing_variants(config)
    if len(variants) > 1:
        log.info("hyperopt: the parameters preprocess the dataset in %d ways; each is preprocessed once", len(variants))
    prepared = {}
    for variant in variants:
        if choice.processor == "ray_data":
            from raylight.declarative.ray_data import prepare_ray_data

            parts = prepare_ray_data(variant, dataset, progress=progress)
            one = api.Prepared(variant, parts["meta"], parts["train"], parts["validation"], parts["test"], None)
        else:
            one = api.prepare(variant, dataset)
        if h.split == "validation" and one.validation is None:  # a fixed split's column can give it none
            raise ConfigError(
                f"hyperopt.split is validation, but preprocessing.split ({variant.preprocessing.split.type}) "
                "gives the validation split no rows; give rows the value 1 in its column, or set "
                "hyperopt.split: training"
            )
        prepared[preprocessing_key(variant)] = api.in_store(one)  # every trial's workers read the same arrays
    base, own = config.model_dump(mode="json"), config._own
    os.makedirs(out, exist_ok=True)
    trial_fn = tune.with_resources(
        tune.with_parameters(_declarative_trial, base=base, own=own, prepared=prepared, shape=shape),
        tune.PlacementGroupFactory(shape.bundles),
    )
    with _tune_output(progress and verbosity.is_verbose()):
        if resume:
            log.info("hyperopt: continuing the search in %s", out)
            tuner = tune.Tuner.restore(
                os.path.join(out, EXPERIMENT), trial_fn, resume_unfinished=True, resume_errored=True,
                param_space=search.search_space_for(h),
            )
        else:
            tuner = _new_tuner(trial_fn, h, out, concurrency, progress)
        grid = tuner.fit()
    rows = results_table(grid, h, base, own)
    ok = [r for r in rows if r.get("best") is not None]
    if not ok:
        first = next((r["error"] for r in rows if r.get("error")), "no trial reported the metric")
        raise RaylightError(f"hyperopt: no trial reported {h.metric_name}; first error: {first}")
    if (failed := errored_trials(rows)) is not None:
        log.warning("%s", failed)
    best_row = (min if h.goal == "minimize" else max)(ok, key=lambda r: r["best"])
    best = trial_config(base, {k: best_row[f"config.{k}"] for k in h.parameters}, own)
    paths = write_outputs(out, rows, best, h)
    if progress:
        print_table(rows, h)
    return {
        "output_directory": out,
        "num_trials": len(rows),
        "max_concurrent_trials": concurrency.max_concurrent,
        "concurrency": concurrency.reason,
        "best": {k: best_row[f"config.{k}"] for k in h.parameters},
        "best_metric": best_row["best"],
        "metric": h.metric_name,
        **paths,
    }


EXPERIMENT = "tune"  # the Tune experiment's directory inside the output directory


def _connect(out: str) -> None:
    """Connect to Ray, then check every live node sees ``out`` (``worker_group.node_reach``),
    before any preprocessing or trial: each trial writes its checkpoints and results there from its own node (a
    trial's driver needs no CPU, so any node may hold one), so a directory on the driver's
    disk alone loses the trials placed elsewhere. A ConfigError naming the nodes, else
    nothing."""
    from raylight.driver import runtime
    from raylight.worker_group.node_reach import nodes_not_seeing

    runtime.connect(None)
    missing = nodes_not_seeing(out)
    if missing:
        where = "; ".join(f"on {node}: {why}" for node, why in sorted(missing.items()))
        raise ConfigError(
            f"--output-directory {out!r} is not shared with every node Ray may place a trial on: the "
            f"driver wrote a marker there and those nodes did not see it ({where}). Each trial writes its "
            "checkpoints and results into the output directory from its own node; give a directory on a "
            "filesystem mounted at the same path on every node (NFS, EFS), or run the search where the "
            "driver's node holds every trial"
        )


def _resumable_dir(path: str) -> str:
    """``--resume``: the output directory of a search that Tune can restore (its
    experiment directory holds Tune's state), checked before any work."""
    from ray import tune

    path = os.path.abspath(path)
    experiment = os.path.join(path, EXPERIMENT)
    if not os.path.isdir(experiment) or not tune.Tuner.can_restore(experiment):
        raise ConfigError(
            f"--resume: output directory {path!r} holds no search to continue ({experiment!r} has no Tune "
            "experiment state); drop --resume to start one there, or give the --output-directory of the search"
        )
    return path


@contextlib.contextmanager
def _tune_output(shown: bool) -> Iterator[None]:
    """Tune's own output only when ``shown``. Its newer output engine prints the
    "Configuration for experiment" table and "View detailed results here" even at
    ``verbose=0``; with ``RAY_AIR_NEW_OUTPUT=0`` (Ray's switch back to the older engine,
    read as the Tuner is made and as it runs) ``verbose=0`` prints nothing."""
    if shown:
        yield
        return
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def _new_tuner(trial_fn: Any, h: HyperoptConfig, out: str, concurrency: ConcurrencyPlan, progress: bool) -> Any:
    """The Tuner of a new search, written under ``out/tune``. The search algorithm holds
    the plan's trials-at-once (``search.search_algorithm``). Tune's own status tables only
    when verbose; otherwise a line per trial event (``TrialLines``) and raylight's table
    at the end."""
    from ray import tune

    from raylight.tune.progress import TrialLines

    tune_output = progress and verbosity.is_verbose()
    lines: list[tune.Callback] = [TrialLines(h.metric_name, num_trials=search.num_trials(h))] if progress and not tune_output else []
    return tune.Tuner(
        trial_fn,
        param_space=search.search_space_for(h),
        tune_config=tune.TuneConfig(
            metric=h.metric_name,
            mode=search.mode(h),
            search_alg=search.search_algorithm(h, concurrency.max_concurrent),
            scheduler=search.scheduler(h),
            num_samples=h.executor.num_samples,
            time_budget_s=h.executor.time_budget_s,
            # A trial process serves the next trial, and its idle raylight workers with it
            # (docs/performance.md): trials of one search share a shape.
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            storage_path=out, name=EXPERIMENT, verbose=1 if tune_output else 0, callbacks=lines,
        ),
    )


def results_table(grid: Any, h: HyperoptConfig, base: dict[str, Any], own: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per trial: parameters, best and last metric, epochs run, and status:
    COMPLETED (all epochs, or its own early stop), STOPPED (by the scheduler or the
    time budget) or ERROR."""
    metric = h.metric_name
    better = min if h.goal == "minimize" else max
    rows = []
    for result in grid:
        history = result.metrics_dataframe
        values = [] if history is None or metric not in history else [float(v) for v in history[metric].dropna()]
        trial_id = (result.metrics or {}).get("trial_id") or os.path.basename(result.path or "")
        row: dict[str, Any] = {"trial": trial_id}
        for key in h.parameters:
            row[f"config.{key}"] = (result.config or {}).get(key)
        sampled = {k: v for k, v in (result.config or {}).items() if k in h.parameters}
        epochs = trial_config(base, sampled, own).trainer.epochs if len(sampled) == len(h.parameters) else None
        finished = bool((result.metrics or {}).get("early_stop")) or len(values) == epochs
        row.update(
            {
                "best": better(values) if values else None,
                "last": values[-1] if values else None,
                "epochs": len(values),
                "status": "ERROR" if result.error else ("COMPLETED" if finished else "STOPPED"),
                "error": None if result.error is None else f"{type(result.error).__name__}: {result.error}"[:500],
                "history": values,
            }
        )
        rows.append(row)
    return rows


def errored_trials(rows: list[dict[str, Any]]) -> str | None:
    """What to say of the trials that ended in an error when others did not (the best is
    chosen among those): how many, and the first error. None when none did."""
    errors = [r for r in rows if r.get("status") == "ERROR"]
    if not errors:
        return None
    return (
        f"hyperopt: {len(errors)} of {len(rows)} trials ended in an error, and the best is chosen among "
        f"the others; the first error (trial {errors[0].get('trial')}): {errors[0].get('error')}. Each "
        "trial's is in results.json"
    )


def print_table(rows: list[dict[str, Any]], h: HyperoptConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"hyperopt: {h.goal} {h.metric_name}")
    keys = [f"config.{k}" for k in h.parameters]
    for col in ["trial", *keys, "best", "last", "epochs", "status"]:
        table.add_column(col.removeprefix("config."))
    for r in sorted(rows, key=lambda r: (r["best"] is None, r["best"] if h.goal == "minimize" else -(r["best"] or 0))):
        table.add_row(*[_cell(r.get(c)) for c in ["trial", *keys, "best", "last", "epochs", "status"]])
    Console(stderr=True).print(table)


def _short(trial: Any) -> str:
    """A trial's label in the plot: Tune's id ends with the trial's number (``3f2a1_00004``)."""
    text = str(trial)
    return text.rsplit("_", 1)[-1] if "_" in text else text


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def write_outputs(out: str, rows: list[dict[str, Any]], best: ModelConfig, h: HyperoptConfig) -> dict[str, str]:
    import pandas as pd

    from raylight.declarative.loading import render_config

    flat = [{k: v for k, v in r.items() if k != "history"} for r in rows]
    csv_path, json_path = os.path.join(out, "results.csv"), os.path.join(out, "results.json")
    atomic_write(csv_path, pd.DataFrame(flat).to_csv(index=False))
    atomic_write(json_path, json.dumps({"metric": h.metric_name, "goal": h.goal, "trials": rows}, indent=2, default=str))
    best_path = os.path.join(out, "best_config.yaml")
    header = f"# the best trial's config ({h.metric_name}); train it with:\n#   raylight train --config {best_path} --dataset DATASET\n"
    atomic_write(best_path, header + render_config(best))
    plot_path = os.path.join(out, "hyperopt.png")
    plot_search(rows, h, plot_path)
    return {"results_csv": csv_path, "results_json": json_path, "best_config": best_path, "plot": plot_path}


def plot_search(rows: list[dict[str, Any]], h: HyperoptConfig, path: str) -> None:
    """Left: the metric per epoch of every trial, each line labelled with its trial (the
    legend, as in the results table). Right: each trial's best metric against each numeric
    parameter (categorical ones by position), each point labelled with its trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(h.parameters)
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(4.5 * (1 + len(keys)), 3.8), squeeze=False)
    ax = axes[0][0]
    for r in rows:
        if r["history"]:
            ax.plot(range(1, len(r["history"]) + 1), r["history"], marker=".", alpha=0.8, label=_short(r["trial"]))
    if any(r["history"] for r in rows):
        ax.legend(fontsize="small", title="trial", ncol=2 if len(rows) > 8 else 1)
    ax.set_xlabel("epoch")
    ax.set_ylabel(h.metric_name)
    ax.set_title("trials")
    ax.grid(alpha=0.3)
    for ax, key in zip(axes[0][1:], keys, strict=True):
        done = [r for r in rows if r["best"] is not None]
        xs: list[Any] = [r[f"config.{key}"] for r in done]
        ys = [r["best"] for r in done]
        numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
        if numeric:
            ax.scatter(xs, ys)
            if h.parameters[key].space == "loguniform":
                ax.set_xscale("log")
        else:
            labels = sorted({str(x) for x in xs})
            xs = [labels.index(str(x)) for x in xs]
            ax.scatter(xs, ys)
            ax.set_xticks(range(len(labels)), labels)
        for x, y, r in zip(xs, ys, done, strict=True):
            ax.annotate(_short(r["trial"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        ax.set_xlabel(key)
        ax.set_ylabel(f"best {h.metric_name}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)

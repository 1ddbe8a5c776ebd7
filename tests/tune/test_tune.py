"""Ray Tune searches whose trials are distributed raylight runs, on the real 2-CPU
session cluster: schedulers, PBT checkpoint restore, the time budget, fail-fast sizing,
and `raylight hyperopt` end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys
import time

import pytest
import torch

pytest.importorskip("ray.tune")

from ray import tune

import raylight.tune as rt
from raylight.base.exceptions import InsufficientResourcesError
from raylight.declarative.loading import load_config
from tests.conftest import REPO
from tests.helpers import pid_alive, wait_until
from tests.support.tune_loops import long_loop, offset_loop, pbt_loop, pid_loop, sharded_loop

sys.path.insert(0, os.path.join(REPO, "examples", "declarative"))
from make_datasets import write_all

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]
# @pytest.mark.beside: a test with no timer or deadline, run beside the rest (tests/conftest.py BESIDE)


def _run_config(tmp_path, name):
    return tune.RunConfig(storage_path=str(tmp_path / "tune"), name=name, verbose=1)


def _reported(result):
    """The rows a trial reported, and its last result. Once, in a full suite run, Ray Tune
    handed back an empty metrics_dataframe for a trial that PBT had restarted (it reads
    the trial's result.json); the last result still carries every field the loop
    reports, restored_* included."""
    df = result.metrics_dataframe
    rows = [] if df is None or df.empty else df.to_dict("records")
    return [*rows, result.metrics] if result.metrics else rows


@pytest.mark.slow
def test_pbt_restores_checkpoints(ray_cluster, tmp_path):
    """Two 1-worker trials side by side: the slow one exploits the fast one's raylight
    checkpoint (through a ray.tune.Checkpoint) and continues from its score. Epochs are
    long (real work, ~1-2 s) and PBT may act at every one, so the trials' start-up skew
    cannot make both finish before PBT sees them side by side. With reuse_actors, as Tune
    advises for PBT, the exploit resets the slow trial's process and restores in it."""
    trainable = rt.trainable(pbt_loop, num_workers=1, base_config={"epochs": 5, "steps": 8000})
    pbt = tune.schedulers.PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=1, quantile_fraction=0.5,
        resample_probability=0.0, hyperparam_mutations={"rate": [0.0, 1.0]},
    )
    grid = tune.Tuner(
        trainable,
        param_space={"rate": tune.grid_search([1.0, 0.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt, reuse_actors=True),
        run_config=_run_config(tmp_path, "pbt"),
    ).fit()
    assert not grid.errors
    slow = sorted(grid, key=lambda r: r.path)[1]  # started with rate 0.0: alone, its score stays 0
    restored = [row for row in _reported(slow) if row.get("start_epoch", 0) > 0]
    every = {r.path[-40:]: [{k: row.get(k) for k in ("training_iteration", "score", "start_epoch")} for row in _reported(r)] for r in grid}
    assert restored, f"the slow trial was never restored from a checkpoint: {every}"
    # It continued from the fast trial's state: score epoch + 1 after that epoch.
    for row in restored:
        assert row["restored_score"] == row["restored_epoch"] + 1.0 > 0, row
        assert row["start_epoch"] == row["restored_epoch"] + 1, row


@pytest.mark.beside
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_sharded_trial_fails_once_resumes_from_its_tune_checkpoint_and_ends_equal(ray_cluster, tmp_path, strategy):
    """A 2-worker trial under each sharded strategy: every report's sharded checkpoint goes
    to Tune (shards and all); the trial fails once, Tune restarts it from that checkpoint
    (resharded into the new workers) and it ends where one plain process does."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    from raylight.tune.trial import from_tune_checkpoint
    from tests.support import deepspeed_loops as ds

    trainable = rt.trainable(
        sharded_loop, num_workers=2, strategy=strategy,
        base_config={"epochs": ds.EPOCHS, "fail_after": 2, "marker": str(tmp_path / "marker")},
    )
    run = tune.RunConfig(
        storage_path=str(tmp_path / "tune"), name=strategy, verbose=0,
        failure_config=tune.FailureConfig(max_failures=1),
    )
    grid = tune.Tuner(trainable, run_config=run).fit()
    assert not grid.errors and (tmp_path / "marker").exists()
    (result,) = grid
    rows = _reported(result)
    assert max(row["start"] for row in rows) >= 2, f"the trial never resumed from a checkpoint: {rows}"
    restored = from_tune_checkpoint(result.checkpoint)
    assert restored.sharded and restored.load()["epoch"] == ds.EPOCHS - 1
    got, want = restored.load()["model"], ds.reference()
    for key in want:  # the one-process reference; 1e-5 as in tests/worker/test_deepspeed.py
        assert torch.allclose(got[key].float(), want[key], atol=1e-5, rtol=0), key


@pytest.mark.beside
def test_trials_in_a_reused_trial_process_take_the_last_trials_workers(ray_cluster, tmp_path):
    """TuneConfig(reuse_actors=True), trials one after another: Tune gives each the trial
    process the last one ran in, and raylight's worker pool gives it the worker process
    the last trial's run ended with, instead of starting new ones (docs/tune.md)."""
    trainable = rt.trainable(pid_loop, num_workers=1)
    grid = tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([0, 1, 2])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1, reuse_actors=True),
        run_config=_run_config(tmp_path, "reused"),
    ).fit()
    assert not grid.errors, grid.errors
    rows = [row for r in grid for row in _reported(r)]
    assert len({r["trial_id"] for r in rows}) == 3 and all(r["loss"] >= 0 for r in rows), rows
    assert len({r["pid"] for r in rows}) == 1, f"a trial started in a new trial process: {rows}"
    assert len({r["worker_pid"] for r in rows}) == 1, f"a trial started new worker processes: {rows}"
    # The idle worker the trial process kept goes with it when the search ends.
    wait_until(lambda: not pid_alive(rows[0]["worker_pid"]), 30, "the trial process's idle worker to exit")


def test_time_budget_stops_search(ray_cluster, tmp_path):
    """Four trials that would each run for minutes; the search ends at time_budget_s."""
    trainable = rt.trainable(long_loop, num_workers=1, base_config={"epochs": 20000})
    start = time.monotonic()
    grid = tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([0, 1, 2, 3])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", time_budget_s=8),
        run_config=_run_config(tmp_path, "budget"),
    ).fit()
    elapsed = time.monotonic() - start
    assert elapsed < 50, f"the search ran {elapsed:.0f}s, past a time budget of 8s"
    # Stopped, not finished (on a loaded machine a trial may not reach its first report).
    epochs = [r.metrics.get("training_iteration", 0) if r.metrics else 0 for r in grid]
    assert max(epochs) < 20000, epochs


def test_over_large_trial_fails_fast(ray_cluster):
    """Ray Tune would wait forever for a trial the cluster can never place."""
    start = time.monotonic()
    with pytest.raises(InsufficientResourcesError, match=r"CPU: 3.*CPU: 2.*num_workers"):
        rt.check_resources(rt.trainable(offset_loop, num_workers=3))
    with pytest.raises(InsufficientResourcesError, match=r"bundle \{CPU: 4\}"):
        rt.check_resources(rt.get_tune_resources(1, cpus_per_worker=4))
    assert time.monotonic() - start < 5


# -- raylight hyperopt ---------------------------------------------------------------
HYPEROPT_YAML = os.path.join(REPO, "examples", "tune", "breast_cancer_hyperopt.yaml")


@pytest.fixture(scope="module")
def breast_cancer(tmp_path_factory):
    return write_all(str(tmp_path_factory.mktemp("data")))["breast_cancer"]


def _cli(*args: str):
    from typer.testing import CliRunner

    from raylight.cli.main import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.beside
def test_hyperopt_cli_end_to_end(ray_cluster, tmp_path, breast_cancer):
    """The example YAML as a grid of four learning rates, one good and three too small
    to learn (each output's loss weighed 2 and every number input min-max normalised, by
    Ludwig's feature-level parameters): four 2-worker trials on 2 CPUs with max_concurrent_trials auto (so one
    at a time, the good one first), Ray Data preprocessing once before them, and ASHA
    stopping the bad trials at the first rung."""
    out = tmp_path / "search"
    res = _cli(
        "hyperopt", "--config", HYPEROPT_YAML, "--dataset", breast_cancer, "--output-directory", str(out), "--quiet",
        "--set", "trainer.epochs=2",
        "--set", "hyperopt.parameters={trainer.learning_rate: {space: grid, values: [0.05, 1.0e-6, 2.0e-6, 3.0e-6]}, "
        "defaults.category.loss.weight: {space: choice, categories: [2.0]}, "  # Ludwig's feature-level spelling
        "defaults.number.preprocessing.normalization: {space: choice, categories: [minmax]}}",
        "--set", "hyperopt.search_alg={type: grid}",
        "--set", "hyperopt.executor={num_samples: 1, scheduler: {type: asha, max_t: 2, grace_period: 1, reduction_factor: 4}}",
    )
    assert res.exit_code == 0, res.output
    # quiet: raylight's lines and table, none of Tune's own (its newer output engine prints
    # these two even at verbose=0)
    assert "Configuration for experiment" not in res.output and "View detailed results" not in res.output
    results = json.loads((out / "results.json").read_text())
    trials = sorted(results["trials"], key=lambda t: t["trial"])
    assert results["metric"] == "validation_accuracy"
    assert [t["config.trainer.learning_rate"] for t in trials] == [0.05, 1e-6, 2e-6, 3e-6]
    assert [(t["status"], t["epochs"]) for t in trials] == [("COMPLETED", 2)] + [("STOPPED", 1)] * 3, trials
    assert (out / "results.csv").read_text().count("\n") == 5
    assert (out / "hyperopt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The best config is a plain training config with the best trial's values.
    best = load_config(str(out / "best_config.yaml"))
    assert best.hyperopt is None and best.trainer.learning_rate == 0.05 and best.output_features[0].loss_weight == 2.0
    assert all(t["config.defaults.category.loss.weight"] == 2.0 for t in trials)
    # each trial trained on the preprocessing its normalization gives (made on Ray Data first,
    # beside the config's own zscore; a trial finds its arrays by its config's preprocessing)
    assert {t["config.defaults.number.preprocessing.normalization"] for t in trials} == {"minmax"}
    assert {f.preprocessing.normalization for f in best.input_features} == {"minmax"}
    check = _cli("check", "--config", str(out / "best_config.yaml"), "--dataset", breast_cancer)
    assert check.exit_code == 0, check.output


@pytest.mark.beside
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("num_samples: 4", "num_samples: 0"), "hyperopt.executor.num_samples: Input should be greater than or equal to 1"),
        (("trainer.learning_rate: {space", "trainer.learnig_rate: {space"), "parameters.trainer.learnig_rate: trainer.learnig_rate is not a key"),
        (("num_workers: 2", "num_workers: 3"), "one trial needs {CPU: 3} but the cluster has {CPU: 2} in all"),
    ],
    ids=["bad-value", "bad-key-path", "trial-too-large"],
)
def test_hyperopt_cli_bad_input_exits_2(ray_cluster, tmp_path, breast_cancer, edit, expected):
    with open(HYPEROPT_YAML) as f:
        text = f.read()
    assert edit[0] in text
    config = tmp_path / "bad.yaml"
    config.write_text(text.replace(edit[0], edit[1]))
    out = tmp_path / "search"
    start = time.monotonic()
    res = _cli("hyperopt", "--config", str(config), "--dataset", breast_cancer, "--output-directory", str(out), "--quiet")
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.output.split()), res.output
    assert not out.exists(), "bad input left an output directory"
    assert time.monotonic() - start < 15


@pytest.mark.beside
def test_hyperopt_on_validation_with_a_fixed_split_that_gives_it_no_rows_exits_2(ray_cluster, tmp_path, breast_cancer):
    """The rows of a fixed split are known only once the data is read: a search measured
    on the validation split whose column gives it none stops before any trial."""
    import pandas as pd

    df = pd.read_parquet(breast_cancer) if breast_cancer.endswith(".parquet") else pd.read_csv(breast_cancer)
    df["split"] = [0, 0, 0, 2] * (len(df) // 4) + [0] * (len(df) % 4)
    data = tmp_path / "fixed.csv"
    df.to_csv(data, index=False)
    out = tmp_path / "search"
    res = _cli(
        "hyperopt", "--config", HYPEROPT_YAML, "--dataset", str(data), "--output-directory", str(out), "--quiet",
        "--set", "preprocessing.split={type: fixed}",
    )
    assert res.exit_code == 2, res.output
    assert "hyperopt.split is validation, but preprocessing.split (fixed) gives the validation split no rows" in " ".join(
        res.output.split()
    ), res.output
    assert not out.exists()


@pytest.mark.beside
def test_digits_tune_example(ray_cluster, tmp_path):
    """examples/tune/digits_tune.py as users run it (as __main__), kept small."""
    path = os.path.join(REPO, "examples", "tune", "digits_tune.py")
    module = runpy.run_path(path, run_name="digits_tune_example")
    out = module["main"](["--num-samples", "2", "--epochs", "2", "--workers", "1", "--storage", str(tmp_path)])
    assert out["num_trials"] == 2 and out["errors"] == 0
    assert out["best_metrics"]["accuracy"] > 0.5


@pytest.mark.beside
def test_lightning_report_callbacks(ray_cluster, tmp_path):
    """TuneReportCallback and TuneReportCheckpointCallback in a Lightning fit inside a
    trial: metrics per validation and a Lightning checkpoint per epoch reach Tune."""
    if importlib.util.find_spec("lightning") is None:  # not imported here: it sets env vars
        pytest.skip("needs lightning")
    from tests.support.tune_loops import lightning_trial

    grid = tune.Tuner(
        tune.with_resources(lightning_trial, {"cpu": 1}),
        param_space={"lr": 0.05, "root": str(tmp_path / "pl")},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=_run_config(tmp_path, "lightning"),
    ).fit()
    assert not grid.errors, grid.errors
    rows = grid[0].metrics_dataframe
    assert len(rows) == 4 and rows["loss"].notna().all()  # per epoch: validation end, train epoch end
    assert rows["checkpoint_dir_name"].notna().sum() == 2
    assert grid[0].checkpoint is not None
    with grid[0].checkpoint.as_directory() as d:
        assert os.path.exists(os.path.join(d, "model.ckpt"))


def test_worker_group_too_small_placement_group_fails_fast(ray_cluster):
    """raylight.fit inside a placement group with one worker bundle, asked for two
    workers: a clear error at once, not a nested group waiting forever."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from tests.support.tune_loops import fit_inside_placement_group

    pg = placement_group([{"CPU": 1}])
    try:
        assert ray.get(pg.ready(), timeout=30) is not None
        task = ray.remote(fit_inside_placement_group).options(
            num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_capture_child_tasks=True),
        )
        message = ray.get(task.remote(2), timeout=60)
    finally:
        remove_placement_group(pg)
    assert message is not None and "hold 1 workers x {CPU: 1}, but 2 are needed" in message
    assert "get_tune_resources(num_workers=...)" in message


def _overlap_trial(config):
    """Holds its marker in ``config["dir"]`` until it sees another trial's, for at most
    ``config["window_s"]``; reports how many it saw at most (itself included)."""
    import uuid

    me = os.path.join(config["dir"], uuid.uuid4().hex)
    open(me, "w").close()
    seen, deadline = 1, time.monotonic() + config["window_s"]
    while seen < 2 and time.monotonic() < deadline:
        seen = max(seen, len(os.listdir(config["dir"])))
        time.sleep(0.05)
    os.remove(me)
    tune.report({config["metric"]: float(seen), "seen": seen})


def test_a_seeded_search_runs_the_planned_trials_at_once(ray_cluster, tmp_path):
    """`raylight hyperopt`'s Tuner with a seeded random search and a plan of one trial at
    a time: no two trials run together (each would see the other's marker), and Tune says
    nothing of max_concurrent_trials being ignored. Before the plan moved into the search
    algorithm, Tune ignored it for a seeded search and ran both small trials at once."""
    import logging

    from raylight.declarative import hyperopt
    from raylight.tune.resources import ConcurrencyPlan

    h = load_config(HYPEROPT_YAML, [
        "hyperopt.parameters={trainer.learning_rate: {space: uniform, lower: 0.01, upper: 0.1}}",
        "hyperopt.search_alg={type: random, seed: 3}",
        "hyperopt.executor={num_samples: 2, scheduler: {type: fifo}}",
    ]).hyperopt
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    marks = tmp_path / "marks"
    marks.mkdir()
    trial = tune.with_resources(
        tune.with_parameters(_overlap_trial_wrapper, dir=str(marks), window_s=5.0, metric=h.metric_name), {"CPU": 0.1}
    )
    keep = Keep(logging.WARNING)
    logging.getLogger("ray.tune").addHandler(keep)
    try:
        tuner = hyperopt._new_tuner(trial, h, str(tmp_path / "out"), ConcurrencyPlan(1, "one at a time"), progress=False)
        grid = tuner.fit()
    finally:
        logging.getLogger("ray.tune").removeHandler(keep)
    assert [r.metrics["seen"] for r in grid] == [1, 1]
    assert not [m for m in said if "max_concurrent_trials" in m], said


def _overlap_trial_wrapper(config, dir, window_s, metric):
    _overlap_trial({**config, "dir": dir, "window_s": window_s, "metric": metric})

"""Ray Tune searches whose trials are distributed raylight runs, on the real 2-CPU
session cluster: schedulers, PBT checkpoint restore, the time budget, fail-fast sizing,
and `raylight hyperopt` end to end."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray.tune")

from ray import tune

import raylight.tune as rt
from raylight.exceptions import InsufficientResourcesError
from tests.ray.tune_loops import long_loop, offset_loop, pbt_loop

pytestmark = pytest.mark.timeout(240)


def _run_config(tmp_path, name):
    return tune.RunConfig(storage_path=str(tmp_path / "tune"), name=name, verbose=0)


def test_asha_stops_bad_trials(ray_cluster, tmp_path):
    """Three 2-worker trials one at a time (2 CPUs); the first is good, so ASHA stops
    the two bad ones at the first rung."""
    trainable = rt.trainable(offset_loop, num_workers=2, base_config={"epochs": 3})
    plan = rt.check_resources(trainable, num_trials=3)
    assert plan.max_concurrent == 1
    grid = tune.Tuner(
        trainable,
        param_space={"offset": tune.grid_search([0.0, 10.0, 10.0])},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=plan.max_concurrent,
            scheduler=tune.schedulers.ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2),
        ),
        run_config=_run_config(tmp_path, "asha"),
    ).fit()
    assert not grid.errors
    results = sorted(grid, key=lambda r: r.path)  # grid order: the good trial first
    iters = [r.metrics["training_iteration"] for r in results]
    assert iters == [3, 1, 1], [(r.config, r.metrics_dataframe["loss"].tolist()) for r in results]


def test_pbt_restores_checkpoints(ray_cluster, tmp_path):
    """Two 1-worker trials side by side, synchronous PBT: at epoch 2 the slow trial
    exploits the fast one's raylight checkpoint (through a ray.tune.Checkpoint) and
    continues from its score; both resume from Tune checkpoints after the pause."""
    trainable = rt.trainable(pbt_loop, num_workers=1, base_config={"epochs": 4, "steps": 300})
    pbt = tune.schedulers.PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.5,
        resample_probability=0.0, hyperparam_mutations={"rate": [0.0, 1.0]},
    )
    grid = tune.Tuner(
        trainable,
        param_space={"rate": tune.grid_search([1.0, 0.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt),
        run_config=_run_config(tmp_path, "pbt"),
    ).fit()
    assert not grid.errors
    slow = sorted(grid, key=lambda r: r.path)[1]  # started with rate 0.0: its own score stays 0
    rows = slow.metrics_dataframe.to_dict("records")
    restored = [row for row in rows if row.get("start_epoch", 0) > 0]
    assert restored, f"the slow trial was never restored from a checkpoint: {rows}"
    # It continued from the fast trial's state: score 2.0 after epochs 0 and 1.
    assert all(row["restored_epoch"] == 1 and row["restored_score"] == 2.0 for row in restored), restored


def test_time_budget_stops_search(ray_cluster, tmp_path):
    """Trials that would run for minutes; the search ends at time_budget_s."""
    trainable = rt.trainable(long_loop, num_workers=1, base_config={"epochs": 3000})
    start = time.monotonic()
    grid = tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search([0, 1, 2, 3])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", time_budget_s=8),
        run_config=_run_config(tmp_path, "budget"),
    ).fit()
    elapsed = time.monotonic() - start
    assert elapsed < 45, f"the search ran {elapsed:.0f}s past a time budget of 8s"
    epochs = [r.metrics.get("training_iteration", 0) for r in grid]
    assert max(epochs) < 3000 and sum(epochs) > 0, epochs


def test_over_large_trial_fails_fast(ray_cluster):
    """Ray Tune would wait forever for a trial the cluster can never place."""
    start = time.monotonic()
    with pytest.raises(InsufficientResourcesError, match=r"CPU: 3.*CPU: 2.*num_workers"):
        rt.check_resources(rt.trainable(offset_loop, num_workers=3))
    with pytest.raises(InsufficientResourcesError, match=r"bundle \{CPU: 4\}"):
        rt.check_resources(rt.get_tune_resources(1, cpus_per_worker=4))
    assert time.monotonic() - start < 5

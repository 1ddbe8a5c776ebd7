"""Warm worker processes reused across runs of one driver (raylight.worker_group.pool)."""

from __future__ import annotations

import importlib
import os
import sys
import time

import pytest
import torch

import raylight
from raylight import ScalingConfig
from raylight.worker_group.pool import POOL
from tests.helpers import deepspeed_releases_groups, pid_alive, wait_until
from tests.support import pool_loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


@pytest.fixture
def pool(ray_cluster):
    raylight.release_workers()
    yield POOL
    raylight.release_workers()


def _fit(loop, tmp_path, name, **kwargs):
    return raylight.fit(loop, num_workers=2, storage_path=str(tmp_path), name=name, progress=False, **kwargs)


def _fit_with(scaling: ScalingConfig, loop, tmp_path):
    config = raylight.TrainerConfig(scaling=scaling, run=raylight.RunConfig(storage_path=str(tmp_path), progress=False))
    return raylight.Trainer(loop, config=config).fit()


def test_a_second_fit_runs_on_the_first_fit_s_processes_as_new_ones_would(pool, tmp_path):
    first = _fit(pool_loops.unseeded_loop, tmp_path, "first")
    assert len(pool) == 2, "both workers were kept for the next run"
    second = _fit(pool_loops.unseeded_loop, tmp_path, "second")
    assert second.metrics["pids"] == first.metrics["pids"], "the second run reused both processes"
    # What the first loop changed in its processes is undone: its environment variable,
    # torch's default dtype and deterministic mode; torch's generator is seeded afresh, as
    # a new process's is.
    assert second.metrics["seen"] == "" and second.metrics["dtype"] == "torch.float32"
    assert first.metrics["deterministic"] == second.metrics["deterministic"] == "False,False"
    assert second.metrics["draws"] != first.metrics["draws"]
    raylight.release_workers()
    third = _fit(pool_loops.unseeded_loop, tmp_path, "third")
    assert set(third.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))
    assert len({first.metrics["draws"], second.metrics["draws"], third.metrics["draws"]}) == 3


SHARDED = {
    "fsdp": lambda: raylight.FSDP(min_block_params=1),  # every block its own FSDP unit and device mesh
    "zero2": lambda: raylight.DeepSpeed(stage=2),
    "zero3": lambda: raylight.DeepSpeed(stage=3, config={"zero_optimization": {"stage3_param_persistence_threshold": 0}}),
}
SHARDED["zero3-meta"] = SHARDED["zero3"]  # the model built on the meta device: zero.Init partitions it


# Beside the front run (tests/suite.py): no timer in it, and 70 s that evened out the two
# runs (2026-11-28: front 13:35, beside 11:08 before it moved).
@pytest.mark.beside
@pytest.mark.parametrize("strategy", list(SHARDED))
def test_a_sharded_run_trains_on_the_last_run_s_processes_as_on_new_ones(pool, tmp_path, strategy):
    """FSDP and DeepSpeed leave nothing in a process that the next run sees (DeepSpeed's
    process groups are released with the run's): the second run reuses both processes and
    ends with the same parameters and optimizer state, bit for bit; a DDP run after it
    starts new processes (sharded workers keep malloc tuned: the pool keeps them apart by
    strategy, one key for all of DeepSpeed's stages, so that is checked once per strategy)."""
    if strategy != "fsdp":
        pytest.importorskip("deepspeed")
    first, second = (
        _fit(pool_loops.adam_pid_loop, tmp_path, name, strategy=SHARDED[strategy](), config={"meta": "meta" in strategy})
        for name in ("a", "b")
    )
    if strategy == "fsdp" or deepspeed_releases_groups():
        assert second.metrics["pids"] == first.metrics["pids"], "the second run reused both processes"
    else:  # DeepSpeed < 0.19.8 keeps the old group: its workers are never pooled, and train the same
        assert set(second.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))
    want, got = first.checkpoint.load(), second.checkpoint.load()
    assert want["model"].keys() == got["model"].keys()
    assert all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"])
    moments = [s["exp_avg"] for s in (want["opt"]["state"]["model.0.weight"], got["opt"]["state"]["model.0.weight"])]
    assert torch.equal(*moments) and moments[0].abs().max() > 0
    if strategy in ("fsdp", "zero2"):
        replicated = _fit(pool_loops.pid_loop, tmp_path, "ddp")
        assert set(replicated.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))


def test_a_loop_that_leaves_a_thread_running_gets_new_processes_next_time(pool, tmp_path):
    first = _fit(pool_loops.thread_leaving_loop, tmp_path, "first")
    assert len(pool) == 0
    second = _fit(pool_loops.pid_loop, tmp_path, "second")
    assert set(second.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))
    wait_until(lambda: not any(pid_alive(int(p)) for p in first.metrics["pids"].split(",")), 30, "the first run's workers to exit")


def test_a_worker_whose_user_module_changed_on_disk_is_not_reused(pool, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    module = code / "pool_user_module.py"
    module.write_text("VALUE = 1\n")
    first = _fit(pool_loops.module_loop, tmp_path, "first", config={"dir": str(code)})
    assert first.metrics["value"] == 1 and len(pool) == 2
    module.write_text("VALUE = 2\n")
    os.utime(module, (time.time() + 5, time.time() + 5))  # a new mtime even within its resolution
    second = _fit(pool_loops.module_loop, tmp_path, "second", config={"dir": str(code)})
    assert second.metrics["value"] == 2, "the edited module is what runs"
    assert set(second.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))


MOVED_MODULE = """
from tests.support.pool_loops import _pids

VALUE = {value}


def loop(ctx):
    ctx.report({{"pids": _pids(), "value": VALUE}})
"""


def test_a_worker_holding_a_module_the_driver_now_imports_from_elsewhere_is_not_reused(pool, tmp_path):
    """The driver's ``sys.path`` changed between two fits (a notebook pointed at another
    checkout) and the same module name is now another file: the second fit runs that file,
    not the one its pooled processes imported for the first."""
    for value in (1, 2):
        (tmp_path / f"v{value}").mkdir()  # code; the runs go under tmp_path / "runs"
        (tmp_path / f"v{value}" / "pool_moved_module.py").write_text(MOVED_MODULE.format(value=value))
    results, saved = [], list(sys.path)
    try:
        for value in (1, 2):
            sys.path[:] = [str(tmp_path / f"v{value}"), *saved]
            sys.modules.pop("pool_moved_module", None)
            module = importlib.import_module("pool_moved_module")
            assert value == module.VALUE
            results.append(_fit(module.loop, tmp_path / "runs", f"v{value}"))
    finally:
        sys.path[:] = saved
        sys.modules.pop("pool_moved_module", None)
    first, second = results
    assert first.metrics["value"] == 1
    assert second.metrics["value"] == 2, "the module the driver imports now is what runs"
    assert set(second.metrics["pids"].split(",")).isdisjoint(first.metrics["pids"].split(","))


def test_idle_workers_go_after_their_timeout_and_hold_no_resources_meanwhile(pool, tmp_path):
    import ray

    scaling = ScalingConfig(num_workers=2, idle_worker_timeout_s=5.0)
    first = _fit_with(scaling, pool_loops.pid_loop, tmp_path)
    pids = [int(p) for p in first.metrics["pids"].split(",")]
    total = ray.cluster_resources()["CPU"]
    wait_until(lambda: ray.available_resources().get("CPU") == total, 5, "the run's placement group to be removed")
    assert len(pool) == 2 and all(pid_alive(p) for p in pids), "idle workers live on, holding no CPU"
    wait_until(lambda: not any(pid_alive(p) for p in pids), 30, "idle workers to be killed after idle_worker_timeout_s")
    assert len(pool) == 0


def test_reuse_can_be_turned_off(pool, tmp_path):
    first = _fit_with(ScalingConfig(num_workers=2, reuse_workers=False), pool_loops.pid_loop, tmp_path)
    assert len(pool) == 0
    wait_until(lambda: not any(pid_alive(int(p)) for p in first.metrics["pids"].split(",")), 30, "the workers to exit")


def test_prestarted_workers_are_the_next_fit_s_and_start_only_where_that_fit_would_take_them(pool, tmp_path):
    """``raylight.prestart_workers`` (the declarative ray backend's, while it preprocesses) hands
    new processes of the fit's shape to the pool at once, importing what it is told; that
    fit trains on them and hands them back. Asked again, or for a shape this node cannot
    hold, or that is not pooled, it starts nothing."""
    import ray

    from raylight import prestart_workers

    assert prestart_workers(num_workers=2, modules=("tests.support.pool_loops",)) == 2
    assert len(pool) == 2
    assert prestart_workers(num_workers=2) == 0, "the pool already holds them"
    pids = sorted(ray.get([idle.actor.node_info.remote() for idle in list(pool._idle)], timeout=60), key=lambda n: n["pid"])
    assert all(ray.get(idle.actor.loaded_modules.remote(), timeout=60).count("tests.support.pool_loops") for idle in list(pool._idle))
    run = _fit(pool_loops.pid_loop, tmp_path, "prestarted")
    assert sorted(run.metrics["pids"].split(",")) == sorted(str(n["pid"]) for n in pids), "the fit took the prestarted processes"
    assert len(pool) == 2, "and handed them back"
    raylight.release_workers()
    cpus = int(ray.cluster_resources()["CPU"])
    assert prestart_workers(num_workers=cpus + 1) == 0, "more than this node holds: the fit would place them elsewhere"
    assert prestart_workers(num_workers=2, use_gpu=True) == 0, "GPU workers are not pooled"
    assert len(pool) == 0

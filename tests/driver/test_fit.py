"""The core engine on a real local Ray cluster (2 CPUs), real gloo, real DDP."""

from __future__ import annotations

import pickle
import random
import sys

import fsspec
import pytest
import torch

import raylight
from raylight import FailureConfig, RunConfig, ScalingConfig, TrainerConfig
from raylight.storage.checkpoint import Checkpoint
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_two_workers_match_one_process_with_the_same_global_batch(ray_cluster, tmp_path):
    """Also: DDP's gradients through shared memory (the default on CPU) and through gloo
    alone (``DDP(shared_memory=False)``) train the same model."""
    config = {"lr": 0.05, "batch_size": 32, "epochs": 3, "report_hooks": True}
    two = raylight.fit(loops.sgd_loop, config=config, num_workers=2, storage_path=str(tmp_path), name="two", progress=False)
    gloo = raylight.fit(loops.sgd_loop, config=config, num_workers=2, strategy=raylight.DDP(shared_memory=False),
                        storage_path=str(tmp_path), name="gloo", progress=False)
    one = raylight.fit(loops.sgd_loop, config=config, num_workers=0, storage_path=str(tmp_path), name="one", progress=False)
    ref = loops.reference_sgd(config)
    assert two.metrics == {"world_size": 2, "hooks": "raylight.worker.strategies.shm_allreduce.comm_hook"}
    assert gloo.metrics == {"world_size": 2, "hooks": ""}
    p2, pg, p1 = (r.checkpoint.load()["model"] for r in (two, gloo, one))
    init = loops.initial_model().state_dict()
    for key in ref:
        assert (ref[key] - init[key]).abs().max() > 1e-2, "training must move the parameters"
        assert torch.equal(p2[key], pg[key]), key  # two ranks: bitwise as gloo's all-reduce
        assert torch.allclose(p2[key], ref[key], atol=1e-5, rtol=0), key
        assert torch.allclose(p1[key], ref[key], atol=1e-5, rtol=0), key


def test_workers_keep_long_lived_objects_out_of_full_collections(ray_cluster, tmp_path):
    # A full collection over the ~290,000 objects of torch and Ray takes 130-200 ms and
    # stalls every rank; workers freeze what is alive at the loop's start and first batch.
    result = raylight.fit(loops.gc_loop, config={"setup_objects": 20_000}, num_workers=2, storage_path=str(tmp_path), progress=False)
    m = result.metrics
    assert m["at_start"] > 50_000, "torch and Ray's objects are frozen before the loop starts"
    # Frozen objects freed since (a few hundred) leave the count, hence not all of them.
    assert m["after_first_batch"] - m["at_start"] > 0.9 * m["kept"], "so is what the loop set up"


def test_exception_in_rank_1_reaches_driver_with_traceback(ray_cluster, tmp_path):
    with pytest.raises(raylight.WorkerError) as info:
        raylight.fit(loops.failing_loop, num_workers=2, storage_path=str(tmp_path), progress=False)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError" and err.exc_message == "boom at step 3"
    assert "_explode" in err.worker_traceback and "failing_loop" in err.worker_traceback
    assert "worker rank 1" in str(err) and "max_failures" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert pickle.loads(pickle.dumps(err)).rank == 1


def test_a_name_error_before_the_first_step_ends_the_run_at_once_with_its_traceback(ray_cluster, tmp_path):
    """max_failures=3 would allow three restarts; a NameError the loop raises before its
    first step, the same on every rank, is an error in the code that a restart raises
    again, so the run ends after one attempt, with the worker's traceback, the rule that
    stopped it and no advice to raise max_failures."""
    attempts = tmp_path / "attempts.txt"
    with pytest.raises(raylight.WorkerError) as info:
        raylight.fit(loops.name_error_loop, config={"attempts": str(attempts)}, num_workers=2, max_failures=3,
                     storage_path=str(tmp_path), name="typo", progress=False)
    err = info.value
    assert sorted(attempts.read_text().split()) == ["0", "1"], "1 attempt of 2 ranks"
    assert err.num_failures == 1 and err.exc_type == "NameError" and "modle" in err.exc_message
    assert "name_error_loop" in err.worker_traceback and "Traceback from worker rank" in str(err)
    assert "NameError raised by the training loop before its first step" in str(err)
    assert "stops without retrying (max_failures=3 does not apply to it)" in str(err)
    assert "raise FailureConfig" not in str(err) and "automatically" not in str(err)


def test_hung_worker_is_detected(ray_cluster, tmp_path):
    trainer = raylight.Trainer(
        loops.hanging_loop,
        config=TrainerConfig(
            scaling=ScalingConfig(num_workers=2),
            run=RunConfig(storage_path=str(tmp_path), progress=False),
            failure=FailureConfig(hang_timeout_s=2.0),
        ),
    )
    with pytest.raises(raylight.WorkerHangError) as info:
        trainer.fit()
    assert info.value.rank == 1
    assert "hang_timeout_s=2s" in str(info.value)


def test_a_rank_in_a_collective_its_finished_peer_never_called_is_told_why(ray_cluster, tmp_path):
    """Rank 0 alone calls ctx.barrier(); rank 1 finishes, and gloo fails rank 0's barrier
    with "Connection closed by peer ... typically caused by a remote worker crashing":
    the error says rank 1 had finished and what to do."""
    with pytest.raises(raylight.WorkerError) as info:
        raylight.fit(loops.rank0_barrier_loop, num_workers=2, storage_path=str(tmp_path), progress=False)
    assert info.value.rank == 0
    text = str(info.value).split("Traceback from worker")[0]
    assert "(rank 1 had finished the loop: a collective that only some ranks call" in text
    assert "call it on every rank" in text


def test_an_adaptive_run_clips_each_step_s_gradient_through_prepare_optimizer(ray_cluster, tmp_path):
    """Two DDP workers, adaptive: the optimizer is raylight's wrapper and the clip at its
    steps holds SGD to lr x 1e-6 a step, where the gradients' norms are far larger."""
    result = raylight.fit(
        loops.clipped_loop, config={"clip": 1e-6}, num_workers=2, storage_path=str(tmp_path), progress=False,
        adaptive=raylight.AdaptiveConfig(),
    )
    assert result.metrics["optimizer"] == "AdaptiveOptimizer"
    assert result.metrics["min_norm"] > 1e-2, "unclipped, a step would move the weights by 1e-3 or more"
    # at most 8 steps of lr 0.1 x 1e-6, times the LR rule's factor (at most 8: the batch is
    # capped at the 256 samples)
    assert result.metrics["moved"] < 1e-5


def test_too_many_workers_fails_fast_with_numbers(ray_cluster, tmp_path):
    with pytest.raises(raylight.InsufficientResourcesError) as info:
        raylight.fit(loops.sgd_loop, num_workers=3, storage_path=str(tmp_path), progress=False)
    text = str(info.value)
    assert "3 workers x {CPU: 1} need {CPU: 3}" in text and "{CPU: 2}" in text
    assert "num_workers" in text


def _import_from(directory, name: str, body: str):
    """A module ``name`` in ``directory``, imported by this driver from there."""
    import importlib

    directory.mkdir()
    (directory / f"{name}.py").write_text(body)
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    return importlib.import_module(name)


_FOUND = "import sys\n\ndef loop(ctx, config):\n    ctx.report({'file': __file__, 'first': sys.path[0]})\n"


def test_the_workers_import_a_loop_from_where_the_driver_found_it_or_say_once_what_to_do(ray_cluster, tmp_path, monkeypatch):
    """On the embedded cluster the workers search the driver's sys.path (a module the
    driver found through its own ``sys.path.insert``); a module the workers still cannot
    import ends the run at its start, once, not retried, with one error that says why."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # put back after the test
    found = _import_from(tmp_path / "lib", "rl_found_here", _FOUND)
    result = raylight.fit(found.loop, num_workers=2, storage_path=str(tmp_path / "runs"), name="found", progress=False)
    assert result.metrics == {"file": str(tmp_path / "lib" / "rl_found_here.py"), "first": str(tmp_path / "lib")}

    gone = _import_from(tmp_path / "gone", "rl_gone_from_the_path", _FOUND)
    sys.path.remove(str(tmp_path / "gone"))  # the driver imported it and took its directory off
    with pytest.raises(raylight.WorkerImportError) as info:
        raylight.fit(gone.loop, num_workers=2, storage_path=str(tmp_path / "runs"), name="gone", max_failures=3, progress=False)
    text = str(info.value)
    assert info.value.module == "rl_gone_from_the_path"
    assert "cannot import module 'rl_gone_from_the_path'" in text and "(rl_gone_from_the_path.loop)" in text
    assert f"imported it from {tmp_path / 'gone' / 'rl_gone_from_the_path.py'}" in text
    assert "driver's sys.path" in text and "Traceback" not in text and "rank -1" not in text


def test_the_loop_and_its_config_are_pickled_once_per_start_and_what_cannot_be_is_named(ray_cluster, tmp_path):
    """Once for both workers (each ``.remote`` call pickled them again before); a config
    value that cannot be pickled is a ConfigError naming its key, before any worker or
    run directory exists."""
    import threading

    loops.CountsPickles.pickled = 0
    result = raylight.fit(
        loops.epoch_loop, config={"epochs": 1, "probe": loops.CountsPickles()}, num_workers=2,
        storage_path=str(tmp_path), name="once", progress=False,
    )
    assert result.metrics["epoch"] == 0 and loops.CountsPickles.pickled == 1

    with pytest.raises(raylight.ConfigError) as info:
        raylight.fit(loops.epoch_loop, config={"epochs": 1, "data": {"lock": threading.Lock()}}, num_workers=2,
                     storage_path=str(tmp_path), name="lock", progress=False)
    text = str(info.value)
    assert text.startswith("the training loop or its config cannot be sent to the workers: TypeError: cannot pickle")
    assert "Found in: config['data']['lock'] (_thread.lock)" in text and "Checking Serializability" not in text
    assert not (tmp_path / "lock").exists()


def test_a_worker_whose_poll_fails_is_a_failure_of_that_rank_not_a_crash_of_the_driver(ray_cluster, tmp_path):
    with pytest.raises(raylight.TrainingFailedError) as info:
        raylight.fit(loops.unpollable_loop, num_workers=2, storage_path=str(tmp_path), progress=False)
    assert info.value.rank == 1
    assert "could not be polled: TypeError: cannot pickle '_thread.lock' object" in str(info.value)


def test_sigkilled_worker_restarts_from_last_checkpoint(ray_cluster, tmp_path):
    config = {
        "epochs": 5,
        "kill_after": 1,
        "marker": str(tmp_path / "killed"),
        "run_dir": str(tmp_path / "k"),
    }
    result = raylight.fit(
        loops.epoch_loop, config=config, num_workers=2, storage_path=str(tmp_path), name="k",
        max_failures=1, progress=False,
    )
    assert (tmp_path / "killed").exists()
    assert result.num_failures == 1
    history = result.metrics_history
    assert [m["epoch"] for m in history] == [0, 1, 2, 3, 4]
    # Epochs 0-1 ran in the first attempt; the restart began after checkpoint 1.
    assert [m["start"] for m in history] == [0, 0, 2, 2, 2]
    assert result.checkpoint.load()["epoch"] == 4


def test_sigkill_without_restarts_names_the_worker_and_setting(ray_cluster, tmp_path):
    config = {"epochs": 3, "kill_after": 0, "marker": str(tmp_path / "m"), "run_dir": str(tmp_path / "d")}
    with pytest.raises(raylight.WorkerDiedError) as info:
        raylight.fit(loops.epoch_loop, config=config, num_workers=2, storage_path=str(tmp_path), name="d", progress=False)
    assert info.value.rank == 1 and "max_failures=0" in str(info.value)


def test_memory_storage_round_trips(ray_cluster):
    result = raylight.fit(
        loops.epoch_loop, config={"epochs": 2}, num_workers=2, storage_path="memory://rl-tests",
        name="mem", progress=False,
    )
    assert result.path == "memory://rl-tests/mem"
    assert result.checkpoint.path.startswith("memory://rl-tests/mem/checkpoints/")
    fresh = Checkpoint(result.checkpoint.path)  # reads back from storage, not the cache
    assert fresh.load()["epoch"] == 1
    with fsspec.open("memory://rl-tests/mem/metrics.jsonl", "r") as f:
        assert len(f.read().splitlines()) == 2


def test_sigkilled_workers_lose_and_repeat_no_sample(ray_cluster, tmp_path):
    """Workers SIGKILLed mid-epoch at seeded steps (rank 0 too); each restart resumes at
    the last checkpoint's exact sample: every epoch's sum over samples is the dataset's."""
    rng = random.Random(16)
    kills = [[rng.randrange(2), rng.randrange(2, 14)] for _ in range(3)]
    n = 240
    config = {
        "epochs": 3, "n": n, "batch_size": 16, "checkpoint_every": 4, "adaptive": False,
        "kills": kills, "marker": str(tmp_path / "killed"),
    }
    result = raylight.fit(
        loops.elastic_loop, config=config, num_workers=2, storage_path=str(tmp_path), name="acct",
        max_failures=len(kills), progress=False,
    )
    assert result.metrics_history, "no report"
    assert result.num_failures == len(kills)
    assert all((tmp_path / f"killed{i}").exists() for i in range(len(kills)))
    epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
    assert [m["epoch"] for m in epochs] == [0, 1, 2]
    for m in epochs:
        assert (m["count"], m["sum"], m["sq"]) == (n, n * (n - 1) / 2, sum(i * i for i in range(n))), (kills, m)
        assert m["epoch_count"] == n, "the epoch's own accumulator (made each epoch) resumed its own sums"


def test_an_address_naming_another_cluster_than_this_process_uses_is_refused(ray_cluster, tmp_path):
    """A process already connected to one Ray cluster (here the session's) and given the
    address of another trained on the first, the address silently ignored."""
    from raylight.base.exceptions import ClusterConnectionError

    with pytest.raises(ClusterConnectionError, match=r"address='127.0.0.1:1' names another Ray cluster .*ray.shutdown\(\)"):
        raylight.fit(loops.failing_loop, num_workers=1, storage_path=str(tmp_path), progress=False, address="127.0.0.1:1")
    # the cluster it uses, by its own address, is the same cluster: no error there
    import ray

    from raylight.driver import runtime

    runtime.connect(ray.get_runtime_context().gcs_address)

"""Sharded training through raylight.fit on a real local Ray cluster (2 CPUs, gloo):
FSDP2 trains like one process, its checkpoints survive a SIGKILLed worker, and a run
resumes from them at another world size."""

from __future__ import annotations

import os

import pytest
import torch

import raylight
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def test_fsdp_trains_like_one_process(ray_cluster, tmp_path):
    config = {"lr": 0.05, "batch_size": 32, "epochs": 3}
    result = raylight.fit(
        loops.sgd_loop, config=config, num_workers=2, strategy="fsdp",
        storage_path=str(tmp_path), name="fsdp", progress=False,
    )
    if "GLIBC_TUNABLES" not in os.environ:  # sharded CPU workers start with huge pages for malloc
        from raylight.worker.strategies.base import HEAP_TUNABLES

        assert result.metrics["tunables"] == HEAP_TUNABLES
    ref, init = loops.reference_sgd(config), loops.initial_model().state_dict()
    got = result.checkpoint.load()["model"]
    for key in ref:
        assert type(got[key]) is torch.Tensor, "the checkpoint holds full, plain tensors"
        assert (ref[key] - init[key]).abs().max() > 1e-2, "training must move the parameters"
        assert torch.allclose(got[key], ref[key], atol=1e-5, rtol=0), key


def _fit(tmp_path, name, **kwargs):
    config = {"epochs": 5, "run_dir": str(tmp_path / name), **kwargs.pop("config", {})}
    return raylight.fit(
        loops.epoch_loop, config=config, strategy=raylight.FSDP(min_block_params=1),
        storage_path=str(tmp_path), name=name, progress=False, **kwargs,
    )


def test_a_sigkilled_fsdp_worker_resumes_from_the_sharded_run_and_ends_equal(ray_cluster, tmp_path):
    plain = _fit(tmp_path, "plain", num_workers=2)
    killed = _fit(
        tmp_path, "killed", num_workers=2, max_failures=1,
        config={"kill_after": 1, "marker": str(tmp_path / "marker")},
    )
    assert (tmp_path / "marker").exists() and killed.num_failures == 1
    for result in (plain, killed):  # every rank wrote its shards; the driver committed them
        assert result.checkpoint.sharded and result.checkpoint.metadata["format"] == "sharded"
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(result.checkpoint.metadata["files"])
    assert [m["start"] for m in killed.metrics_history] == [0, 0, 2, 2, 2]
    want, got = plain.checkpoint.load()["model"], killed.checkpoint.load()["model"]
    for key in want:
        # float64, the same reductions in the same order: only the restart differs
        assert torch.allclose(got[key], want[key], atol=1e-12, rtol=0), key


def test_an_fsdp_run_resumes_at_another_world_size(ray_cluster, tmp_path):
    whole = _fit(tmp_path, "whole", num_workers=2)
    _fit(tmp_path, "resized", num_workers=2, config={"epochs": 2})
    resized = _fit(tmp_path, "resized", num_workers=1, resume=True)
    assert [m["start"] for m in resized.metrics_history][-3:] == [2, 2, 2]
    want, got = whole.checkpoint.load()["model"], resized.checkpoint.load()["model"]
    for key in want:
        # the same global batches; one worker sums them in another order than two
        assert torch.allclose(got[key], want[key], atol=1e-10, rtol=0), key


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_declarative_config_trains_sharded(ray_cluster, tmp_path, strategy):
    """FSDP with a fixed batch; DeepSpeed ZeRO-2 (Ludwig's spelling) with batch_size: auto,
    i.e. adaptive."""
    import pandas as pd

    from raylight.declarative import api
    from raylight.declarative.loading import load_config
    from tests.declarative_data import CONFIG, write

    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    spec = "fsdp" if strategy == "fsdp" else "{type: deepspeed, zero_optimization: {stage: 2}}"
    config = CONFIG.replace(
        "backend: {type: local}",
        f"backend: {{type: ray, processor: {{type: pandas}}, trainer: {{strategy: {spec}, num_workers: 2}}}}",
    )
    if strategy == "deepspeed":
        assert "batch_size: 32" in config
        config = config.replace("batch_size: 32", "batch_size: auto")
    cfg, data = write(tmp_path, fmt="parquet", config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["backend"] == "ray" and out["evaluation"]["test"]["accuracy"] > 0.6
    predicted = raylight.load_model(str(tmp_path / "run" / "model")).predict(pd.read_parquet(data))
    assert len(predicted) > 0, "the model gathered from the shards predicts"


def test_a_tune_trial_trains_sharded(ray_cluster, tmp_path):
    pytest.importorskip("ray.tune")
    from ray import tune

    import raylight.tune as rt

    trainable = rt.trainable(loops.sharding_loop, num_workers=2, strategy="fsdp")
    grid = tune.Tuner(
        trainable, run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="fsdp", verbose=0)
    ).fit()
    result = grid[0]
    assert result.error is None, result.error
    assert result.metrics["sharded"] is True and result.metrics["world_size"] == 2


class _Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)
        self.gain = torch.nn.Parameter(torch.tensor(1.0))  # 0-dim: FSDP2 cannot shard it


def _gated_loop(ctx, config):
    ctx.prepare_model(_Gated())
    ctx.report({"never": 1})


def test_a_model_fsdp_cannot_shard_ends_the_run_on_its_first_attempt_saying_what_to_do(ray_cluster, tmp_path):
    """The core's loop builds its model in the workers, where the driver cannot see it:
    each worker checks it before sharding, and its ConfigError is not retried (it was
    torch's "Shard dim 0 is invalid for 0D tensor", retried max_failures times)."""
    from raylight.base.exceptions import WorkerError

    with pytest.raises(WorkerError) as err:
        raylight.fit(
            _gated_loop, num_workers=2, strategy="fsdp", max_failures=3,
            storage_path=str(tmp_path), name="gated", progress=False,
        )
    text = str(err.value)
    assert "the model's parameters gain are 0-dim" in text and "nn.Parameter(torch.ones(1))" in text
    assert "stops without retrying" in text and err.value.num_failures == 1, text

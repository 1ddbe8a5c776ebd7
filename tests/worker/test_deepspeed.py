"""DeepSpeed through raylight.fit on a real local Ray cluster (2 CPUs, gloo): ZeRO trains
like one process, its sharded checkpoints survive a SIGKILLed worker and resume at another
world size (and under ZeRO-3), the example and a declarative config run; on GPUs, over NCCL."""

from __future__ import annotations

import json
import os
import runpy

import pytest
import torch

import raylight
from tests.conftest import REPO
from tests.support import deepspeed_loops as loops

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _fit(tmp_path, name, strategy="deepspeed", **kwargs):
    config = {"epochs": loops.EPOCHS, "run_dir": str(tmp_path / name), **kwargs.pop("config", {})}
    return raylight.fit(
        loops.epoch_loop, config=config, strategy=strategy, storage_path=str(tmp_path), name=name,
        progress=False, **kwargs,
    )


@pytest.fixture(scope="module")
def whole(ray_session, tmp_path_factory):
    """An uninterrupted 2-worker ZeRO-2 run (the others are compared with it)."""
    return _fit(tmp_path_factory.mktemp("whole"), "whole", num_workers=2)


def test_deepspeed_trains_like_one_process_and_checkpoints_sharded(ray_cluster, whole):
    got, want, init = whole.checkpoint.load()["model"], loops.reference(), loops.initial_model().state_dict()
    for key in want:
        assert type(got[key]) is torch.Tensor, "Checkpoint.load() gives plain, whole tensors"
        assert (want[key] - init[key]).abs().max() > 1e-2, "training must move the parameters"
        # fp32, 20 Adam steps: two workers' averaged gradient is the global batch's up to
        # rounding (~1e-7 relative); Adam moves a weight by at most lr = 1e-2 a step, so
        # 1e-5 is 0.1% of one step, far below a lost or doubled reduction
        assert torch.allclose(got[key], want[key], atol=1e-5, rtol=0), key
    assert whole.checkpoint.sharded, "every worker wrote its shards"
    with open(os.path.join(whole.checkpoint.path, "meta.json")) as f:
        meta = json.load(f)  # what the driver committed
    assert meta["format"] == "sharded" and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(meta["files"])
    opt = whole.checkpoint.load()["opt"]
    assert set(opt["state"]["model.0.weight"]) == {"exp_avg", "exp_avg_sq", "step"}, "torch's layout"
    assert float(opt["state"]["model.0.weight"]["step"]) == 20
    assert whole.metrics["batch"] == [8, 16], "the batch fields come from prepare_loader(batch_size=16)"


def test_a_sigkilled_deepspeed_worker_resumes_from_the_sharded_checkpoint_and_ends_equal(ray_cluster, tmp_path, whole):
    killed = _fit(
        tmp_path, "killed", num_workers=2, max_failures=1,
        config={"kill_after": 1, "marker": str(tmp_path / "marker")},
    )
    assert (tmp_path / "marker").exists() and killed.num_failures == 1
    assert [m["start"] for m in killed.metrics_history] == [0, 0, 2, 2, 2]
    assert killed.checkpoint.sharded
    want, got = whole.checkpoint.load(), killed.checkpoint.load()
    for key in want["model"]:
        # the same reductions in the same order, the state restored bit for bit: equal
        assert torch.equal(got["model"][key], want["model"][key]), key
    assert torch.equal(got["opt"]["state"]["model.0.weight"]["exp_avg"], want["opt"]["state"]["model.0.weight"]["exp_avg"])


def test_a_deepspeed_run_resumes_on_one_worker_under_zero3(ray_cluster, tmp_path, whole):
    zero3 = raylight.DeepSpeed(stage=3, config={"zero_optimization": {"stage3_param_persistence_threshold": 0}})
    _fit(tmp_path, "resized", strategy=zero3, num_workers=2, config={"epochs": 2})
    resized = _fit(tmp_path, "resized", strategy=zero3, num_workers=1, resume=True)
    assert [m["start"] for m in resized.metrics_history][-3:] == [2, 2, 2]
    want, got = whole.checkpoint.load()["model"], resized.checkpoint.load()["model"]
    for key in want:
        # the same global batches; one worker sums them in another order than two (fp32)
        assert torch.allclose(got[key], want[key], atol=1e-5, rtol=0), key


def test_the_deepspeed_example_runs(ray_cluster, tmp_path):
    """examples/deepspeed_mlp.py as users run it, kept small."""
    module = runpy.run_path(os.path.join(REPO, "examples", "deepspeed_mlp.py"), run_name="deepspeed_example")
    result = module["main"](["--epochs", "3", "--quiet", "--storage", str(tmp_path)])
    assert result.metrics["test_accuracy"] > 0.85
    assert result.checkpoint.sharded, "every worker wrote its shards"
    assert result.metrics["zero_stage"] == 2 and result.metrics["world_size"] == 2


def test_a_declarative_config_trains_under_zero2(ray_cluster, tmp_path):
    import pandas as pd

    from raylight.declarative import api
    from raylight.declarative.loading import load_config
    from tests.declarative_data import CONFIG, write

    config = CONFIG.replace(
        "backend: {type: local}",
        "backend: {type: ray, processor: {type: pandas}, trainer: {strategy: {type: deepspeed, stage: 2}, num_workers: 2}}",
    )
    cfg, data = write(tmp_path, fmt="parquet", config=config)
    out = api.train(load_config(cfg), data, output_directory=str(tmp_path / "run"), progress=False)
    assert out["backend"] == "ray" and out["evaluation"]["test"]["accuracy"] > 0.6
    predicted = raylight.load_model(str(tmp_path / "run" / "model")).predict(pd.read_parquet(data))
    assert len(predicted) > 0, "the model from the raw state dicts predicts"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_deepspeed_trains_like_one_process_on_gpus(ray_cluster, tmp_path):
    """ZeRO-2 over NCCL; with one GPU, one worker (DeepSpeed still runs its engine)."""
    n = min(torch.cuda.device_count(), 2)
    result = _fit(tmp_path, "gpu", num_workers=n, use_gpu=True)
    got, want = result.checkpoint.load()["model"], loops.reference()
    for key in want:
        assert torch.allclose(got[key].cpu(), want[key], atol=1e-4, rtol=0), key

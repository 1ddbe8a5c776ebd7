"""GPU tier: NCCL and CUDA devices. Skips cleanly on machines without a GPU (CI)."""

import pytest
import torch

import raylight
from tests.ray import loops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def device_loop(ctx, config):
    model = ctx.prepare_model(loops.initial_model())
    assert next(model.parameters()).device.type == "cuda"
    x = torch.randn(4, 8, dtype=torch.float64, device=ctx.device)
    model(x).sum().backward()
    ctx.report({"device": str(ctx.device), "total": ctx.all_reduce(1.0, op="sum")})


def test_gpu_workers_use_cuda_and_nccl(ray_cluster, tmp_path):
    n = min(torch.cuda.device_count(), 2)
    result = raylight.fit(device_loop, num_workers=n, use_gpu=True, storage_path=str(tmp_path), progress=False)
    assert result.metrics["device"].startswith("cuda") and result.metrics["total"] == n


def test_fsdp_trains_like_one_process_on_gpus(ray_cluster, tmp_path):
    """FSDP2 over NCCL (one GPU shards nothing: the model trains as is on it)."""
    n = min(torch.cuda.device_count(), 2)
    config = {"lr": 0.05, "batch_size": 32, "epochs": 3}
    result = raylight.fit(
        loops.sgd_loop, config=config, num_workers=n, use_gpu=True, strategy="fsdp",
        storage_path=str(tmp_path), progress=False,
    )
    ref, got = loops.reference_sgd(config), result.checkpoint.load()["model"]
    for key in ref:
        assert torch.allclose(got[key].cpu(), ref[key], atol=1e-5, rtol=0), key

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

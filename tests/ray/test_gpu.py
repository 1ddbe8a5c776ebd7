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


def cpu_tensor_loop(ctx, config):
    import torch.distributed as dist

    stats = ctx.accumulator()
    stats["seen"] += 1
    with stats.synchronized():  # its sums are CPU tensors
        seen = stats["seen"]
    on_cpu, on_gpu = torch.ones(1), torch.ones(1, device=ctx.device)
    dist.all_reduce(on_cpu)
    dist.all_reduce(on_gpu)
    ctx.report({"seen": seen, "cpu": on_cpu.item(), "gpu": on_gpu.item()})


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL takes one rank per GPU)")
def test_gpu_workers_reduce_cpu_tensors_over_gloo_beside_nccl(ray_cluster, tmp_path):
    """raylight's own bookkeeping (and a loop's) reduces CPU tensors; a group of NCCL alone
    fails them with 'No backend type associated with device type cpu'."""
    result = raylight.fit(cpu_tensor_loop, num_workers=2, use_gpu=True, storage_path=str(tmp_path), progress=False)
    assert {k: result.metrics[k] for k in ("seen", "cpu", "gpu")} == {"seen": 2, "cpu": 2, "gpu": 2}

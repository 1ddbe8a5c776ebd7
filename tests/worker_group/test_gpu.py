"""GPU tier: NCCL and CUDA devices. Skips cleanly on machines without a GPU (CI)."""

import pytest
import torch

import raylight
from tests.support import loops

pytestmark = [pytest.mark.ray,
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


def offload_loop(ctx, config):
    from torch import nn

    with torch.device("meta"):  # built without memory: each worker allocates its shards
        net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
    model = ctx.prepare_model(net)
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    resumed = ctx.load_checkpoint({"model": model, "opt": opt})
    x = torch.randn(32, 8, device=ctx.device)
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    moments = {v.device.type for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}
    ctx.report(
        {"resumed": resumed is not None, "params": sorted({p.device.type for p in model.parameters()}),
         "buffers": sorted({b.device.type for b in model.buffers()}), "moments": sorted(moments)},
        checkpoint={"model": model, "opt": opt},
    )


def test_fsdp_cpu_offload_trains_a_meta_model_and_resumes_from_a_full_checkpoint(ray_cluster, tmp_path):
    """Offloaded shards live in CPU memory from their start (fully_shard refuses shards
    materialised on the GPU), buffers on the GPU; a full checkpoint's Adam moments load
    next to their CPU shards. One worker goes through fully_shard too."""
    n = min(torch.cuda.device_count(), 2)
    strategy = raylight.FSDP(cpu_offload=True, checkpoint="full")
    common = {"num_workers": n, "use_gpu": True, "strategy": strategy, "storage_path": str(tmp_path), "name": "offload", "progress": False}
    first = raylight.fit(offload_loop, **common)
    again = raylight.fit(offload_loop, **common, resume=True)
    for result, resumed in ((first, False), (again, True)):
        assert result.metrics["resumed"] is resumed
        assert (result.metrics["params"], result.metrics["buffers"], result.metrics["moments"]) == (["cpu"], ["cuda"], ["cpu"])

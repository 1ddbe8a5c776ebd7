"""FSDP2 through raylight's strategy on two real gloo processes (no Ray): the same
training as DDP, checkpoints that are full state dicts, and a full state dict that loads
back into a sharded model and optimizer, or into DDP."""

import copy
import statistics

import pytest
import torch
import torch.distributed as dist
from torch import nn

from raylight.config import FSDP
from raylight.worker.strategies import DDPStrategy, FSDPStrategy
from tests.helpers import run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

STEPS, RESUME_AT = 6, 3
# fp32 parameters after 6 Adam steps: DDP all-reduces the gradients, FSDP reduce-scatters
# them, and gloo sums in a different order, so the gradients differ in the last bits
# (~1e-7 relative). Adam divides by sqrt(v), so a step moves every weight by up to lr
# (1e-3) however small its gradient; 1e-5 is 1% of one step: far below any real
# difference (a missing or doubled gradient reduction moves weights by ~1e-3), far
# above rounding.
TOL = 1e-5
CLIP, CLIP_LR, CLIP_STEPS = 0.05, 0.1, 3  # max_grad_norm below every step's gradient norm


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.Tanh(), nn.Sequential(nn.Linear(32, 32), nn.Tanh()), nn.Linear(32, 1)
    )


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(1, keepdim=True).sin()


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def flat(state: dict) -> dict[str, list[float]]:
    return {k: v.detach().reshape(-1).tolist() for k, v in state.items()}


def run_rank(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    cpu = torch.device("cpu")
    try:
        out = {"rank": rank}
        ddp = DDPStrategy()
        model = ddp.wrap_model(make_model(), device=cpu, world_size=2)
        opt = ddp.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        train(model, opt, rank, range(STEPS))
        out["ddp"] = flat(ddp.unwrap_model(model).state_dict())

        fsdp = FSDPStrategy(FSDP(min_block_params=100))  # the inner Linear(32, 32)s are blocks
        model = fsdp.wrap_model(make_model(), device=cpu, world_size=2)
        opt = fsdp.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        out["sharded"] = [
            (name, tuple(p.to_local().shape), tuple(p.shape)) for name, p in model.named_parameters()
        ]
        train(model, opt, rank, range(RESUME_AT))
        # copied, as ctx.report serialises it at once (Adam's step counter is a plain
        # tensor the optimizer keeps incrementing in place)
        saved = copy.deepcopy(fsdp.full_state({"model": model.state_dict(), "opt": opt.state_dict()}))
        out["saved_plain"] = all(
            type(v) is torch.Tensor for v in saved["model"].values()
        ) and all(type(v) is torch.Tensor for s in saved["opt"]["state"].values() for v in s.values())
        train(model, opt, rank, range(RESUME_AT, STEPS))
        out["fsdp"] = flat(fsdp.full_state(model.state_dict()))

        # resume from the full checkpoint into a new sharded model and optimizer
        model = fsdp.wrap_model(make_model(), device=cpu, world_size=2)
        opt = fsdp.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        fresh = copy.deepcopy(saved)  # as Checkpoint.load() gives each resume its own
        model.load_state_dict(fresh["model"])
        opt.load_state_dict(fresh["opt"])
        train(model, opt, rank, range(RESUME_AT, STEPS))
        out["fsdp_resumed"] = flat(fsdp.full_state(model.state_dict()))

        # and into DDP: a sharded run's checkpoint is an ordinary one
        model = ddp.wrap_model(make_model(), device=cpu, world_size=2)
        opt = ddp.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        fresh = copy.deepcopy(saved)
        ddp.unwrap_model(model).load_state_dict(fresh["model"])
        opt.load_state_dict(fresh["opt"])
        train(model, opt, rank, range(RESUME_AT, STEPS))
        out["ddp_resumed"] = flat(ddp.unwrap_model(model).state_dict())

        # gradient accumulation: no reduction inside no_sync, one at the boundary
        grads = {}
        for strategy in (ddp, fsdp):
            model = strategy.wrap_model(make_model(), device=cpu, world_size=2)
            x, y = batch(rank, 0)
            with strategy.no_sync(model):
                ((model(x[:8]) - y[:8]) ** 2).mean().backward()
            if strategy is fsdp:
                out["grad_inside_no_sync"] = [p.grad is not None for p in model.parameters()]
            ((model(x[8:]) - y[8:]) ** 2).mean().backward()
            grads[strategy.name] = {
                name: strategy.full_state(p.grad).reshape(-1).tolist()
                for name, p in strategy.unwrap_model(model).named_parameters()
            }
        out["grads"] = grads

        # a model built on the meta device: each worker only ever allocates its shards
        with torch.device("meta"):
            meta = make_model()
        model = fsdp.wrap_model(meta, device=cpu, world_size=2)
        first = model[0].weight.to_local()
        out["meta"] = {
            "devices": sorted({p.to_local().device.type for p in model.parameters()}),
            "rows": first.shape[0],
            "values": first.reshape(-1).tolist(),
        }
        with torch.device("meta"):
            meta = make_model()
        out["meta_ddp"] = flat(ddp.unwrap_model(ddp.wrap_model(meta, device=cpu, world_size=2)).state_dict())

        # bf16 compute: parameters gathered and gradients reduced in bf16, kept in fp32
        half = FSDPStrategy(FSDP(min_block_params=100, mixed_precision="bf16"))
        model = half.wrap_model(make_model(), device=cpu, world_size=2)
        opt = half.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
        train(model, opt, rank, range(STEPS))
        state = half.full_state(model.state_dict())
        out["bf16"] = {k: (str(v.dtype), v.tolist()) for k, v in state.items() if k == "0.weight"}

        # max_grad_norm: the all-reduced (DDP) or the whole sharded (FSDP) gradient, clipped
        out["clipped"] = {}
        for strategy in (DDPStrategy(), FSDPStrategy(FSDP(min_block_params=100))):
            model = strategy.wrap_model(make_model(), device=cpu, world_size=2)
            opt = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=CLIP_LR), max_grad_norm=CLIP)
            norms = []
            for step in range(CLIP_STEPS):
                x, y = batch(rank, step)
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                norms.append(strategy.grad_norm())
            state = flat(strategy.full_state(strategy.unwrap_model(model).state_dict()))
            out["clipped"][strategy.name] = {"norms": norms, "state": state}
        queue.put(out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    return run_gloo_ranks(run_rank, timeout_s=150)


def close(a: dict[str, list[float]], b: dict[str, list[float]], tol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


def test_fsdp_holds_half_of_every_parameter(ranks):
    for name, local, full in ranks[0]["sharded"]:
        assert local[0] == (full[0] + 1) // 2, name
    assert ranks[0]["saved_plain"], "a checkpoint holds plain tensors, not DTensors"


def test_fsdp_trains_like_ddp(ranks):
    for rank in (0, 1):
        close(ranks[rank]["fsdp"], ranks[rank]["ddp"], TOL)
    assert ranks[0]["fsdp"] == ranks[1]["fsdp"], "every rank gathers the same model"


def test_a_full_checkpoint_resumes_sharded_exactly_and_under_ddp(ranks):
    zero = ranks[0]
    assert zero["fsdp_resumed"] == zero["fsdp"], "model and Adam state restored bit for bit"
    close(zero["ddp_resumed"], zero["ddp"], TOL)


def test_bf16_compute_keeps_fp32_parameters_close_to_fp32_training(ranks):
    dtype, values = ranks[0]["bf16"]["0.weight"]
    assert dtype == "torch.float32"
    # bf16 keeps 8 bits of mantissa, so gradients differ by ~0.4%; Adam moves a weight by
    # at most lr (1e-3) a step, whatever its gradient: 6 steps can part them by 6e-3 at most
    flat_values = [x for row in values for x in row]
    assert flat_values == pytest.approx(ranks[0]["fsdp"]["0.weight"], abs=STEPS * 1e-3)
    near = sum(abs(a - b) < 1e-3 for a, b in zip(flat_values, ranks[0]["fsdp"]["0.weight"], strict=True))
    assert near >= 0.9 * len(flat_values), "most weights within one step of fp32 training"
    assert flat_values != ranks[0]["fsdp"]["0.weight"], "computed in bf16, not fp32"


def test_no_sync_skips_the_gradient_reduction_and_accumulates_like_ddp(ranks):
    zero = ranks[0]
    assert not any(zero["grad_inside_no_sync"]), "nothing reduce-scattered inside no_sync"
    close(zero["grads"]["fsdp"], zero["grads"]["ddp"], 1e-6)


def test_a_meta_device_model_is_materialised_shard_by_shard(ranks):
    zero, one = ranks[0]["meta"], ranks[1]["meta"]
    assert zero["devices"] == ["cpu"] and zero["rows"] == 16, "each worker holds half of Linear(8, 32)"
    bound = 1 / 8**0.5  # Linear's reset_parameters: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    for values in (zero["values"], one["values"]):
        assert max(abs(v) for v in values) <= bound
        assert statistics.pstdev(values) == pytest.approx(bound / 3**0.5, rel=0.25)
    assert zero["values"] != one["values"], "shards drawn independently, not one block repeated"
    assert ranks[0]["meta_ddp"] == ranks[1]["meta_ddp"], "DDP starts every replica from rank 0's"


def test_max_grad_norm_clips_the_whole_reduced_gradient_under_ddp_and_fsdp(ranks):
    """Both ranks' batches averaged, the gradient's total norm taken over the whole model
    (FSDP: over every rank's shards) and clipped to CLIP before each SGD step: what one
    process computes from both batches."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=CLIP_LR)
    norms = []
    for step in range(CLIP_STEPS):
        opt.zero_grad()
        for rank in (0, 1):
            x, y = batch(rank, step)
            (((model(x) - y) ** 2).mean() / 2).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
    assert min(norms) > CLIP, "every step was clipped"
    want = flat(model.state_dict())
    for name in ("ddp", "fsdp"):
        for rank in (0, 1):
            got = ranks[rank]["clipped"][name]
            assert got["norms"] == pytest.approx(norms, rel=1e-5), (name, rank)
            close(got["state"], want, 1e-6)

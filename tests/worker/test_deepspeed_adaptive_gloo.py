"""Adaptive training under DeepSpeed ZeRO-2 and ZeRO-3 on two real gloo processes (no
Ray): the engine averages each step's micro-steps itself, raylight's AdaptiveOptimizer
ends the steps, and the noise is measured from each rank's micro-batch gradients (hooks,
before ZeRO reduces them) against the engine's norm of the reduced gradient. Two ranks of
two micro-steps of 8 samples measure exactly what one process measures over four
micro-steps of the same 8-sample micro-batches, train to the same parameters with the same
LR factors, and follow a change of accumulation mid-run."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("deepspeed")

from raylight.adaptive.plan import BatchPlan
from raylight.config import DeepSpeed
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.adaptive.sync import StepSync
from raylight.worker.strategies import DDPStrategy, DeepSpeedStrategy
from tests.helpers import run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420)]

EVERY, STEPS, ATOMIC = 4, 16, 8
# micro-batches of 8 samples per step: 4 (2 ranks x 2 micro-steps), then from step
# CHANGE_AT on 2 (2 ranks x 1) -- for the one process 4 and then 2 micro-steps
CHANGE_AT = 10


def micro_batches(step: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(count * ATOMIC, 6, generator=gen)
    y = x.sum(1, keepdim=True) + torch.randn(count * ATOMIC, 1, generator=gen)
    return [(x[i * ATOMIC : (i + 1) * ATOMIC], y[i * ATOMIC : (i + 1) * ATOMIC]) for i in range(count)]


def run_rank(rank: int, port: int, world: int, stage: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, world, rank == 0), rank=rank, world_size=world)
    try:
        if world > 1:
            config = {"zero_optimization": {"stage3_param_persistence_threshold": 0}} if stage == 3 else None
            strategy = DeepSpeedStrategy(DeepSpeed(stage=stage, config=config))
        else:
            strategy = DDPStrategy()
        torch.manual_seed(0)
        model = strategy.wrap_model(
            nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)), device=torch.device("cpu"), world_size=world
        )
        total = 4  # micro-batches a step, over all ranks
        sync = StepSync(
            rank=rank, world_size=world, num_nodes=1, threads=1, plan=BatchPlan(ATOMIC, total // world - 1),
            init_batch_size=total * ATOMIC, adaptive=True, lr_rule="adascale", every=EVERY,
            replicated=strategy.replicated,
        )
        inner = strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), adaptive=True)
        opt = AdaptiveOptimizer(inner, sync=sync)
        factors, stats, gas = [], {}, []
        record = sync.set_grad_stats

        def recorded(**values):  # what the optimizer measured, by step
            stats[step] = (values["small_sqr"], values["big_sqr"], values["small_batch"], values["big_batch"])
            record(**values)

        sync.set_grad_stats = recorded
        for step in range(STEPS):
            if step == CHANGE_AT:
                total = 2
                sync.plan = BatchPlan(ATOMIC, total // world - 1, sync.plan.version + 1)
            plan = sync.begin_step()
            sync.micro_steps, sync.uniform_step = plan.accum_steps + 1, True
            strategy.set_batch_layout(micro_batch=ATOMIC, accumulation=sync.micro_steps)  # as the loader does
            batches = micro_batches(step, total)
            for j in range(sync.micro_steps):
                sync.micro = j
                opt.zero_grad()
                x, y = batches[j * world + rank]
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
            factors.append(sync.lr_factor())
            if world > 1:
                gas.append(strategy.engine().gradient_accumulation_steps())
        if world > 1:
            state = strategy.objects_state({"model": model})["model"]
            params = strategy.full_state(state)
        else:
            params = strategy.unwrap_model(model).state_dict()
        queue.put({
            "rank": rank,
            "gns": (sync.gns.sqr, sync.gns.var, sync.gns.num_updates),
            "stats": stats,
            "factors": factors,
            "gas": gas,
            "params": {k: v.reshape(-1).tolist() for k, v in params.items()},
        })
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one():
    return run_gloo_ranks(run_rank, 1, 0, world_size=1, timeout_s=120)[0]


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def zero(request):
    return run_gloo_ranks(run_rank, 2, request.param, world_size=2, timeout_s=300)


def test_two_deepspeed_ranks_measure_the_noise_one_process_measures(one, zero):
    sqr, var, updates = one["gns"]
    assert updates >= 3 and sqr > 0 and var > 0, "the noise was measured"
    assert sorted(one["stats"]) == [0, 4, 8, 12], "phase-0 steps"
    for step, ref in one["stats"].items():
        mine = [zero[rank]["stats"][step] for rank in (0, 1)]
        # (mean squared micro-batch norm, over the ranks as StepSync averages it; squared
        # norm of the step's gradient; their batches): fp32 gradients reduced over two
        # ranks instead of summed in one process agree to ~1e-6 relative; a micro-step
        # count missed in the scaling, a rank's norms left out or a wrong batch would be
        # off by a factor of 2 or more
        assert (mine[0][0] + mine[1][0]) / 2 == pytest.approx(ref[0], rel=1e-4), step
        assert mine[0][1] == mine[1][1] == pytest.approx(ref[1], rel=1e-4), step
        assert mine[0][2:] == mine[1][2:] == ref[2:], step
    for rank in (0, 1):
        got = zero[rank]
        assert sorted(got["stats"]) == sorted(one["stats"])
        assert got["gns"][2] == updates
        assert got["gns"][0] == pytest.approx(sqr, rel=1e-4) and got["gns"][1] == pytest.approx(var, rel=1e-4)
        assert got["factors"] == pytest.approx(one["factors"], rel=1e-4)
        assert any(f != 1.0 for f in got["factors"]), "AdaScale scaled the LR"


def test_deepspeed_follows_the_accumulation_of_each_step(zero):
    assert zero[0]["gas"] == [2] * CHANGE_AT + [1] * (STEPS - CHANGE_AT)
    big_batches = [zero[0]["stats"][step][3] for step in sorted(zero[0]["stats"])]
    assert big_batches == [32, 32, 32, 16], "4 micro-batches of 8 a step, then 2"


def test_deepspeed_adaptive_training_ends_where_one_process_does(one, zero):
    for key, values in one["params"].items():
        # SGD at lr 0.05 moves weights by ~1e-2 a step; fp32 reductions in another order
        # differ by ~1e-7
        assert zero[0]["params"][key] == pytest.approx(values, abs=1e-5), key

"""Adaptive training under FSDP on two real gloo processes (no Ray): with sharded gradients
the group measures gradient noise as one replica does (micro-steps compared after each
reduction), so two FSDP ranks measure exactly what one process measures on the same
global micro-batches, and train to the same parameters with the same LR factors."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from raylight.adaptive.plan import BatchPlan
from raylight.config import FSDP
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.adaptive.sync import StepSync
from raylight.worker.strategies import DDPStrategy, FSDPStrategy
from tests.helpers import run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

EVERY, STEPS, MICRO = 4, 16, 16  # a global micro-batch of 16 samples, 2 micro-steps a step


def run_rank(rank: int, port: int, world: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, world, rank == 0), rank=rank, world_size=world)
    try:
        strategy = FSDPStrategy(FSDP(min_block_params=10)) if world > 1 else DDPStrategy()
        torch.manual_seed(0)
        model = strategy.wrap_model(
            nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)), device=torch.device("cpu"), world_size=world
        )
        sync = StepSync(
            rank=rank, world_size=world, num_nodes=1, threads=1, plan=BatchPlan(MICRO // world, 1),
            init_batch_size=MICRO, adaptive=True, lr_rule="adascale", every=EVERY, replicated=strategy.replicated,
        )
        opt = AdaptiveOptimizer(strategy.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05)), sync=sync)
        gen = torch.Generator().manual_seed(7)
        per = MICRO // world
        synced_micro_steps, factors = [], []
        for _ in range(STEPS):
            plan = sync.begin_step()
            sync.micro_steps, sync.uniform_step = plan.accum_steps + 1, True
            for j in range(sync.micro_steps):
                sync.micro = j
                opt.zero_grad()
                x = torch.randn(MICRO, 6, generator=gen)  # the same global micro-batch everywhere
                y = x.sum(1, keepdim=True) + torch.randn(MICRO, 1, generator=gen)
                last = j == sync.micro_steps - 1
                # the loader's rule: measuring a sharded group reduces every micro-step
                unsynced = sync.replicated if sync.measuring else not last
                mine = slice(rank * per, (rank + 1) * per)
                with strategy.no_sync(model) if unsynced and world > 1 else torch.enable_grad():
                    ((model(x[mine]) - y[mine]) ** 2).mean().backward()
                synced_micro_steps.append(not unsynced)
                opt.step()
            factors.append(sync.lr_factor())
        params = strategy.full_state(strategy.unwrap_model(model).state_dict())
        queue.put({
            "rank": rank,
            "gns": (sync.gns.sqr, sync.gns.var, sync.gns.num_updates),
            "factors": factors,
            "params": {k: v.reshape(-1).tolist() for k, v in params.items()},
            "synced": synced_micro_steps,
        })
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs():
    return {world: run_gloo_ranks(run_rank, world, world_size=world) for world in (1, 2)}


def test_two_fsdp_ranks_measure_the_noise_one_process_measures(runs):
    one, fsdp = runs[1][0], runs[2]
    sqr, var, updates = one["gns"]
    assert updates >= STEPS // EVERY - 1 and sqr > 0 and var > 0, "the noise was measured"
    for rank in (0, 1):
        # float32 gradients reduced over two ranks instead of summed in one process: the
        # statistics agree to ~1e-6 relative; 1e-4 leaves room, while a wrong batch size
        # (x2) or a missing reduction would be off by a factor
        assert fsdp[rank]["gns"][2] == updates
        assert fsdp[rank]["gns"][0] == pytest.approx(sqr, rel=1e-4)
        assert fsdp[rank]["gns"][1] == pytest.approx(var, rel=1e-4)
        assert fsdp[rank]["factors"] == pytest.approx(one["factors"], rel=1e-4)
        assert any(f != 1.0 for f in fsdp[rank]["factors"]), "AdaScale scaled the LR"


def test_fsdp_adaptive_training_ends_where_one_process_does(runs):
    one, fsdp = runs[1][0], runs[2][0]
    for key, values in one["params"].items():
        assert fsdp["params"][key] == pytest.approx(values, abs=1e-5), key


def test_a_measuring_step_reduces_every_micro_step_and_others_accumulate_unsynced(runs):
    synced = runs[2][0]["synced"]
    # a measuring step (phase 0) reduces both micro-steps; the next (phase 1, accumulating,
    # so not measured) reduces only its last, the first accumulating under no_sync
    assert synced[:4] == [True, True, False, True]

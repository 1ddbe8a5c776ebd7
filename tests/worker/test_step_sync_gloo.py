"""StepSync and AdaptiveOptimizer across two real gloo processes (no Ray): the control
vector rides on the measuring step's gradient all-reduce, and every rank agrees on plans,
the noise estimate and where to stop, exactly as with a control all-reduce of its own."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from raylight.adaptive.plan import BatchPlan
from raylight.worker.adaptive import sync as sync_module
from raylight.worker.adaptive.optimizer import AdaptiveOptimizer
from raylight.worker.adaptive.sync import ResizeInterrupt, StepSync
from raylight.worker.process_group import destroy_process_group
from raylight.worker.strategies import shm_allreduce
from raylight.worker.strategies.shm_allreduce import SharedMemoryAllReduce, comm_hook
from tests.helpers import run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

EVERY = 4
STOP_BEFORE = 9  # rank 1 is asked to stop before this step


def run_rank(rank: int, port: int, carrier: bool, events: bool, shared: bool, check_s: float | None, queue) -> None:
    torch.set_num_threads(1)
    if check_s is not None:  # how long a step must be for a stop check at each step
        sync_module.STOP_CHECK_S = check_s
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        queue.put(_train(rank, carrier, events, shared))  # its DDP model is garbage once it returns
    finally:
        destroy_process_group()  # which frees it before the group (a hung rank otherwise)


def _train(rank: int, carrier: bool, events: bool, shared: bool) -> dict:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)))
    sync = StepSync(
        rank=rank, world_size=2, num_nodes=1, threads=1, plan=BatchPlan(8), init_batch_size=16,
        adaptive=True, lr_rule="adascale", every=EVERY,
    )
    if shared:  # as raylight's DDP on CPU: gradients and control vectors through shared memory
        memory = SharedMemoryAllReduce.create()
        assert memory is not None
        model.register_comm_hook(memory, comm_hook)
        sync.reduce_sum = memory.all_reduce_
    opt = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), sync=sync)
    sync.carrier = carrier
    gen = torch.Generator().manual_seed(100 + rank)
    plans, stopped_at, exchanges = [], None, 0
    for step in range(40):
        if events and rank == 0 and step == 2:
            sync.set_plan(BatchPlan(12, 1, 1))
        if events and rank == 1 and step == STOP_BEFORE:
            sync.request_stop()
        try:
            plan = sync.begin_step()
        except ResizeInterrupt:
            stopped_at = step
            break
        exchanges += sync.exchanging
        plans.append((plan.atomic_bsz, plan.accum_steps))
        sync.micro_steps, sync.uniform_step = plan.accum_steps + 1, True
        for j in range(sync.micro_steps):
            sync.micro = j
            opt.zero_grad()
            x = torch.randn(plan.atomic_bsz, 6, generator=gen)
            y = x.sum(1, keepdim=True) + torch.randn(plan.atomic_bsz, 1, generator=gen)
            last = j == sync.micro_steps - 1
            with model.no_sync() if (sync.measuring or not last) else torch.enable_grad():
                ((model(x) - y) ** 2).mean().backward()
            opt.step()
    return {
        "rank": rank,
        "plans": plans,
        "stopped_at": stopped_at,
        "exchanges": exchanges,
        "gns": (sync.gns.num_updates, sync.gns.sqr, sync.gns.var),
        "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
    }


def run_pair(carrier: bool, events: bool = True, shared: bool = False, check_s: float | None = None) -> dict[int, dict]:
    return run_gloo_ranks(run_rank, carrier, events, shared, check_s)


def test_control_vector_rides_on_the_gradient_all_reduce():
    ranks = run_pair(carrier=True)
    zero, one = ranks[0], ranks[1]
    assert zero["exchanges"] > 0, "measuring steps carried the control vector"
    assert zero["plans"] == one["plans"], "every rank ran every step with the same plan"
    assert zero["plans"][:2] == [(8, 0)] * 2
    # The plan sent before step 2 was agreed in step 4's all-reduce: it applies from step 5.
    assert zero["plans"][4] == (8, 0) and zero["plans"][5] == (12, 1)
    # Asked before step 9: agreed in step 12's all-reduce, raised before step 13 on both.
    assert zero["stopped_at"] == one["stopped_at"] == 13
    assert zero["gns"] == one["gns"] and zero["gns"][0] >= 2
    for a, b in zip(zero["params"], one["params"], strict=True):
        assert a == b, "replicas stay identical"


def test_a_control_all_reduce_of_its_own_stops_at_the_control_step():
    own = run_pair(carrier=False)
    assert own[0]["exchanges"] == 0
    assert own[0]["stopped_at"] == own[1]["stopped_at"] == 12
    assert own[0]["plans"][4] == (12, 1), "and adopts the plan there"


@pytest.mark.parametrize("carrier", [True, False])
def test_with_long_steps_a_stop_is_checked_at_every_step_not_only_at_control_steps(carrier):
    """Steps longer than STOP_CHECK_S (here: a check period far below these steps' time)
    make every rank check for a stop at every step once a step time is known: asked before
    step 9, both stop there, not at the control step 12 (or 13)."""
    ranks = run_pair(carrier=carrier, check_s=1e-9)
    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] == STOP_BEFORE
    assert ranks[0]["plans"] == ranks[1]["plans"]
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert a == b, "replicas stay identical"


def test_the_same_gradient_statistics_reach_the_noise_estimator_either_way():
    riding, own = run_pair(carrier=True, events=False), run_pair(carrier=False, events=False)
    assert riding[0]["stopped_at"] is None and riding[0]["exchanges"] == 40 // EVERY
    n_riding, sqr_riding, var_riding = riding[0]["gns"]
    n_own, sqr_own, var_own = own[0]["gns"]
    assert n_riding == n_own == 40 // EVERY - 1
    assert sqr_riding == pytest.approx(sqr_own, rel=1e-4) and var_riding == pytest.approx(var_own, rel=1e-4)
    for a, b in zip(riding[0]["params"], own[0]["params"], strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7)


@pytest.mark.skipif(not shm_allreduce._eligible_here(), reason="the shared-memory all-reduce is for Linux x86-64")
def test_through_shared_memory_every_rank_agrees_as_through_gloo():
    """The control vector and the measuring step's gradients summed in shared memory: the
    same plans, stop, noise estimate and parameters as through gloo, bit for bit (two ranks)."""
    gloo, shared = run_pair(carrier=True), run_pair(carrier=True, shared=True)
    for key in ("plans", "stopped_at", "exchanges", "gns", "params"):
        assert shared[0][key] == shared[1][key] == gloo[0][key], key

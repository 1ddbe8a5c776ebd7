"""raylight's shared-memory all-reduce for DDP on CPU (strategies/shm_allreduce.py) across
real gloo processes (no Ray): the same average as gloo's all-reduce (bitwise with two
ranks), the same bits on every rank, nothing left in /dev/shm, and a peer that exits,
leaves or stalls fails the wait with an error instead of hanging it."""

import hashlib
import os
import re
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from raylight.config import DDP
from raylight.worker.process_group import destroy_process_group
from raylight.worker.strategies import DDPStrategy
from raylight.worker.strategies import shm_allreduce as shm
from raylight.worker.strategies.shm_allreduce import SharedMemoryAllReduce
from tests.helpers import run_gloo_ranks

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shm._eligible_here(), reason="the shared-memory all-reduce is for Linux x86-64"),
]


def _join(rank: int, port: int, world: int) -> dist.TCPStore:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return store


def _bits(tensor: torch.Tensor) -> str:
    """A digest of the tensor's bytes (tensors themselves would go through the queue as
    shared memory the exiting rank takes with it)."""
    return hashlib.sha256(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _our_files() -> set[str]:
    return {f for f in os.listdir(shm.SHM_DIR) if f.startswith("raylight-ddp-")}


def sums_rank(rank: int, port: int, world: int, queue) -> None:
    _join(rank, port, world)
    try:
        before = _our_files()
        shared = SharedMemoryAllReduce.create()
        assert shared is not None
        dist.barrier()
        left = _our_files() - before  # rank 0 unlinked it once every rank had mapped it
        gen = torch.Generator().manual_seed(rank)
        same, close, results = [], [], []
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            for numel in (1, 1000, 70_000, shared.capacity // torch.tensor([], dtype=dtype).element_size()):
                x = torch.randn(numel, generator=gen).to(dtype)
                ours, theirs = shared.sum_(x.clone()), x.clone()
                dist.all_reduce(theirs)
                same.append(torch.equal(ours, theirs))
                tol = 5e-2 if dtype == torch.bfloat16 else 1e-5
                close.append(torch.allclose(ours.double(), theirs.double(), rtol=tol, atol=tol))
                results.append(_bits(ours))
        queue.put({"rank": rank, "same": same, "close": close, "results": results, "left": sorted(left)})
    finally:
        dist.destroy_process_group()


def test_the_same_average_as_gloo_on_every_rank_and_nothing_left_in_dev_shm():
    before = _our_files()
    two = run_gloo_ranks(sums_rank, 2, world_size=2)
    assert all(two[0]["same"]) and all(two[1]["same"])  # bitwise, with two ranks
    three = run_gloo_ranks(sums_rank, 3, world_size=3)
    assert all(three[0]["close"])  # three add in another order than gloo's ring: up to rounding
    for out in (two, three):
        for r in out:  # every rank the same bits
            assert out[r]["left"] == []
            assert out[r]["results"] == out[0]["results"]
    assert _our_files() == before


def ddp_rank(rank: int, port: int, shared_memory: bool, capacity: int, queue) -> None:
    _join(rank, port, 2)
    try:
        old, shm.CAPACITY_BYTES = shm.CAPACITY_BYTES, capacity
        try:
            strategy = DDPStrategy(DDP(shared_memory=shared_memory))
            torch.manual_seed(0)
            model = strategy.wrap_model(
                nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 5)), device=torch.device("cpu"), world_size=2
            )
        finally:
            shm.CAPACITY_BYTES = old
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(10 + rank)
        for _ in range(20):
            opt.zero_grad()
            x, y = torch.randn(16, 30, generator=gen), torch.randint(0, 5, (16,), generator=gen)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        hooked = len(strategy._shared)
        strategy.close()
        queue.put({"rank": rank, "hooked": hooked, "params": [_bits(p) for p in model.parameters()]})
        model = opt = None  # the DDP model goes before the group
    finally:
        destroy_process_group()


def test_ddp_through_shared_memory_trains_bitwise_as_through_gloo():
    plain = run_gloo_ranks(ddp_rank, False, shm.CAPACITY_BYTES)
    ours = run_gloo_ranks(ddp_rank, True, shm.CAPACITY_BYTES)
    split = run_gloo_ranks(ddp_rank, True, 1024)  # the big bucket by gloo, as too big for 1 KiB
    assert plain[0]["hooked"] == 0 and ours[0]["hooked"] == 1 and split[0]["hooked"] == 1
    for out in (ours, split):
        for r in (0, 1):
            assert out[r]["params"] == plain[0]["params"]


def _exit(queue) -> None:
    """Exit now (the group is broken: no teardown), once what was put on ``queue`` is sent."""
    queue.close()
    queue.join_thread()
    os._exit(0)


def peer_gone_rank(rank: int, port: int, how: str, queue) -> None:
    store = _join(rank, port, 2)
    shared = SharedMemoryAllReduce.create()
    assert shared is not None
    shared.sum_(torch.ones(10))  # one round together
    if rank == 1:
        if how == "exits":
            os._exit(0)
        if how == "leaves":
            shared.close()  # as its strategy does when its loop ends
            store.wait(["rank0_done"])  # alive until rank 0 saw it leave
            queue.put({"rank": 1})
            store.set("rank1_done", "")
            _exit(queue)
        store.wait(["rank0_done"])  # stalls: alive and silent until rank 0 gave up on it
    if rank == 0 and how == "stalls":
        shared.timeout_s = 0.3
    start = time.monotonic()
    try:
        shared.sum_(torch.ones(10))
        error = None
    except dist.DistBackendError as exc:
        error = str(exc)
    queue.put({"rank": rank, "error": error, "after_s": time.monotonic() - start})
    if rank == 1:
        store.set("rank1_done", "")
    elif how == "exits":
        queue.put({"rank": 1})  # rank 1 exited without a word, as planned
    else:
        store.set("rank0_done", "")
        store.wait(["rank1_done"])  # rank 0 holds the store rank 1 waits on
    _exit(queue)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("exits", r"rank 1's process \(pid \d+\) exited during the all-reduce"),
        ("leaves", r"rank 1 left the group"),
        ("stalls", r"ranks \[1\] did not reach the all-reduce within 0.3 s.*collective_timeout_s"),
    ],
)
def test_a_peer_that_exits_leaves_or_stalls_fails_the_wait(how, message):
    out = run_gloo_ranks(peer_gone_rank, how, timeout_s=60)
    assert out[0]["error"] is not None and re.search(message, out[0]["error"]), out[0]
    assert out[0]["after_s"] < 10
    if how == "stalls":  # rank 0 left when it gave up: rank 1, come late, is told so
        assert "rank 0 left the group" in (out[1]["error"] or ""), out[1]


def elsewhere_rank(rank: int, port: int, queue) -> None:
    _join(rank, port, 2)
    try:
        if rank == 1:
            shm._machine_id = lambda: 12345  # as if on another machine
        queue.put({"rank": rank, "shared": SharedMemoryAllReduce.create() is not None})
    finally:
        dist.destroy_process_group()


def test_ranks_on_different_machines_use_gloo_alone():
    out = run_gloo_ranks(elsewhere_rank)
    assert out[0]["shared"] is False and out[1]["shared"] is False

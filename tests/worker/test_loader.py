"""The loader's position logic: global batches, exact coverage across resizes and plans."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset, default_collate

from raylight.adaptive.plan import BatchPlan
from raylight.worker.data.blocks import BlockDataset
from raylight.worker.data.loader import ElasticLoader, fetch_batch, micro_batches, move_to_device


class ScheduledSync:
    """Stands in for StepSync on one simulated rank: the plan of each step comes from a
    schedule shared by all ranks (as the all-reduce would make it)."""

    def __init__(self, plans, world_size):
        self.plans = plans
        self.world_size = world_size
        self.step = 0
        self.micro = 0
        self.micro_steps = 1
        self.uniform_step = True
        self.plan = plans[0]

    measuring = False

    def begin_step(self):
        self.plan = self.plans[min(self.step, len(self.plans) - 1)]
        self.step += 1
        return self.plan

    def tick(self, *, sync_step):
        pass

    def pause_clock(self):
        pass


def ids(n):
    return TensorDataset(torch.arange(n))


def block_ids(n, block=7):
    """The same ids held as blocks of ``block`` rows (the last one shorter), plus an empty
    block, read through a fetch that records what it was asked for."""
    blocks = [{"id": np.arange(lo, min(lo + block, n))} for lo in range(0, n, block)]
    blocks.insert(1, {"id": np.arange(0)})
    return BlockDataset(blocks, [len(b["id"]) for b in blocks], fetch=lambda b: b)


def loaders(n, k, *, batch_size, plans=None, shuffle=True, state=None, data=ids):
    out = []
    for r in range(k):
        sync = ScheduledSync(plans, k) if plans else None
        ld = ElasticLoader(data(n), init_batch_size=batch_size, rank=r, world_size=k, device=torch.device("cpu"), shuffle=shuffle, seed=3, sync=sync)
        if state:
            ld.load_state_dict(state)
        out.append(ld)
    return out


def take(lds, steps=None):
    """Consume (up to ``steps`` optimizer steps of) an epoch on every rank; returns the ids
    per rank per micro-batch."""
    seen = []
    for ld in lds:
        mine, count = [], 0
        it = iter(ld)
        for item in it:
            batch = item["id"] if isinstance(item, dict) else item[0]
            mine.append(batch.tolist())
            sync = ld.sync
            if sync is None or sync.micro == sync.micro_steps - 1:
                count += 1
                if steps is not None and count == steps:
                    break
        seen.append(mine)
    return seen


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_each_global_batch_is_the_single_process_batch(k):
    single = take(loaders(96, 1, batch_size=12))[0]
    shards = take(loaders(96, k, batch_size=12))
    for step, batch in enumerate(single):
        assert sorted(i for r in range(k) for i in shards[r][step]) == sorted(batch)


@pytest.mark.parametrize("data", [ids, block_ids])
@pytest.mark.parametrize("n,bs,k", [(100, 16, 2), (101, 10, 4), (7, 4, 3), (50, 8, 3)])
def test_epoch_covers_every_sample_once(n, bs, k, data):
    shards = take(loaders(n, k, batch_size=bs, data=data))
    assert len({len(s) for s in shards}) == 1, "every rank takes the same number of steps"
    seen = [i for s in shards for b in s for i in b]
    assert set(seen) == set(range(n))
    tail = n % ((bs // k) * k)
    extra = k - tail if 0 < tail < k else 0  # ranks with nothing repeat one sample
    assert len(seen) == n + extra


@pytest.mark.parametrize("data", [ids, block_ids])
def test_resize_and_replan_mid_epoch_neither_repeats_nor_skips(data):
    n = 240
    first = loaders(n, 2, batch_size=16, plans=[BatchPlan(8)], data=data)
    part1 = take(first, steps=5)  # 5 steps x 16 samples
    state = first[0].state_dict()
    assert state == {"epoch": 0, "cursor": 80, "num_samples": n, "iterating": 0}
    # Three workers, atomic 5 with one accumulation step (30 per step), then atomic 10.
    second = loaders(n, 3, batch_size=16, plans=[BatchPlan(5, 1, 1), BatchPlan(5, 1, 1), BatchPlan(10, 0, 2)], state=state, data=data)
    part2 = take(second)
    seen = [i for part in (part1, part2) for rank in part for b in rank for i in b]
    assert sorted(seen) == list(range(n))
    # The same order a single process would have consumed.
    if data is ids:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
    else:
        order = data(n).epoch_order(shuffle=True, seed=3, epoch=0).tolist()
    assert sorted(i for rank in part1 for b in rank for i in b) == sorted(order[:80])


def test_finished_epoch_moves_on_and_set_epoch_resets():
    ld = loaders(10, 1, batch_size=4, shuffle=False)[0]
    assert take([ld])[0] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert ld.epoch_done and ld.epoch == 0
    take([ld], steps=1)
    assert ld.epoch == 1 and ld.cursor == 4
    ld.set_epoch(5)
    assert ld.cursor == 0 and len(ld) == 3


def test_state_from_another_dataset_is_refused():
    ld = loaders(10, 1, batch_size=4)[0]
    with pytest.raises(ValueError, match="resume with the same dataset"):
        ld.load_state_dict({"epoch": 0, "cursor": 4, "num_samples": 11})


def test_micro_batches_split():
    step = torch.arange(20)
    assert micro_batches(step, atomic_bsz=5, rank=1, world_size=2, pad=0) == [[5, 6, 7, 8, 9], [15, 16, 17, 18, 19]]
    assert micro_batches(torch.arange(3), atomic_bsz=5, rank=3, world_size=4, pad=99) == [[99]]


def test_batch_smaller_than_world_and_empty_are_errors():
    with pytest.raises(ValueError, match="at least the number of workers"):
        loaders(10, 4, batch_size=2)
    with pytest.raises(ValueError, match="empty"):
        loaders(0, 1, batch_size=2)


def test_move_to_device_nested():
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), 3], "s": "k"}
    out = move_to_device(batch, torch.device("cpu"))
    assert torch.equal(out["x"], batch["x"]) and out["y"][1] == 3 and out["s"] == "k"


def test_block_order_is_a_seeded_permutation_of_blocks_then_rows():
    data = block_ids(50)
    order = data.epoch_order(shuffle=True, seed=3, epoch=0)
    assert sorted(order.tolist()) == list(range(50))
    assert torch.equal(order, block_ids(50).epoch_order(shuffle=True, seed=3, epoch=0)), "the same on every rank"
    assert not torch.equal(order, data.epoch_order(shuffle=True, seed=3, epoch=1)), "reshuffled every epoch"
    runs = [order[i : i + 7] // 7 for i in range(0, 49, 7)]  # block runs, but the short last block
    blocks = [int(r[0]) for r in runs if len(set(r.tolist())) == 1]
    assert len(blocks) >= 5 and blocks != sorted(blocks), "rows of a block stay together, blocks are permuted"
    assert data.epoch_order(shuffle=False, seed=3, epoch=0).tolist() == list(range(50))


def test_a_rank_reads_a_few_blocks_at_a_time_never_the_whole_dataset():
    k, n = 2, 700
    lds = loaders(n, k, batch_size=20, data=lambda n: block_ids(n, block=50))
    for ld in lds:
        held = 0
        for _ in ld:
            held = max(held, len(ld.dataset.cached))
        assert held <= 2, "at most cache_blocks blocks are held"
        # Contiguous slices of a block-ordered epoch: each block is fetched about once.
        assert ld.dataset.fetches <= ld.dataset.num_blocks + 2


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_batched_fetch_is_what_collating_sample_by_sample_gives():
    gen = torch.Generator().manual_seed(0)
    tensors = TensorDataset(torch.randn(40, 3, 2, generator=gen), torch.randint(0, 5, (40,), generator=gen), torch.arange(40.0))
    rows = {"x": np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32), "y": np.arange(40), "w": np.linspace(0, 1, 40)}
    blocks = [{k: v[lo : lo + 9] for k, v in rows.items()} for lo in range(0, 40, 9)]
    frozen = [{k: v.copy() for k, v in b.items()} for b in blocks]
    for b in frozen:  # read-only, as blocks from the object store are
        for v in b.values():
            v.flags.writeable = False
    table = BlockDataset(frozen, [9, 9, 9, 9, 4], fetch=lambda b: b)
    for indices in ([5], [3, 3, 0], [8, 9, 10, 30, 2, 39], list(range(40))[::-1]):
        for data in (tensors, table):
            _same(fetch_batch(data, indices, default_collate), default_collate([data[i] for i in indices]))
    out = fetch_batch(table, [1, 2], default_collate)
    out["x"] += 1  # a copy, writable, not a view of the block
    assert out["x"].shape == (2, 4) and frozen[0]["x"][1, 0] == rows["x"][1, 0]


def test_batched_fetch_keeps_a_custom_collate_and_checks_indices():
    data = TensorDataset(torch.arange(10))
    seen = []

    def collate(samples):
        seen.append(len(samples))
        return default_collate(samples)

    assert fetch_batch(data, [4, 1], collate)[0].tolist() == [4, 1] and seen == [2]
    with pytest.raises(IndexError, match="index 70 out of range for 50 rows"):
        block_ids(50).get_batch([3, 70])
    with pytest.raises(IndexError, match="at least one index"):
        block_ids(50).get_batch([])


def _epoch_loop(ctx, data, *, report_at=None, log):
    """Two epochs of 4 steps; ``report_at``: the step (counted from 0 across epochs) on
    which the loop reports a checkpoint inside its loop over the loader. Logs each batch
    and each epoch end."""
    loader = ctx.prepare_loader(data, batch_size=8)
    step = 0
    for epoch in ctx.epochs(2):
        for (x,) in loader:
            log.append(("batch", epoch, x[0].item()))
            if step == report_at:
                ctx.report({}, checkpoint={"epoch_seen": epoch})
            step += 1
        log.append(("end", epoch))


@pytest.mark.parametrize("report_at", [3, 2])
def test_a_checkpoint_on_an_epoch_s_last_batch_resumes_into_its_end(report_at):
    """A checkpoint reported inside the loop on the epoch's last batch: the epoch's data is
    consumed, but the code after the loop over it has not run. The restart re-enters the
    epoch with nothing left to hand out, so its end runs (once), then the next epoch. On
    an earlier batch the epoch continues at the next one, as before."""
    from raylight.storage.checkpoint import Checkpoint
    from raylight.worker.context import TrainContext
    from tests.helpers import Sink

    data = TensorDataset(torch.arange(32.0))

    def ctx(sink, checkpoint=None):
        return TrainContext(
            rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
            device=torch.device("cpu"), sink=sink, checkpoint=checkpoint,
        )

    sink, before = Sink(), []
    _epoch_loop(ctx(sink), data, report_at=report_at, log=before)
    data_bytes = next(r.checkpoint for r in sink.reports if r.checkpoint is not None)
    after: list = []
    _epoch_loop(ctx(Sink(), Checkpoint("memory://ckpt", data=data_bytes)), data, log=after)
    ends = [e for e in after if e[0] == "end"]
    resumed_batches = [e for e in after if e[0] == "batch"]
    assert ends == [("end", 0), ("end", 1)], after
    expected_left = 3 - report_at  # batches of epoch 0 after the checkpoint
    assert [e[1] for e in resumed_batches] == [0] * expected_left + [1] * 4, after


def _prepared(data, **kwargs):
    from raylight.worker.data.loader import prepare_loader

    options = {"batch_size": None, "shuffle": None, "seed": 0, "drop_last": None, **kwargs}
    return prepare_loader(data, rank=0, world_size=1, device=torch.device("cpu"), **options)


def _order(loader):
    return [int(x) for (batch,) in loader for x in batch]


def test_a_dataloader_s_shuffle_and_drop_last_are_kept_unless_overridden():
    from torch.utils.data import DataLoader

    data = TensorDataset(torch.arange(10))
    plain = _prepared(DataLoader(data, batch_size=3))
    assert _order(plain) == list(range(10)), "a SequentialSampler: in order, the short last batch kept"
    mixed = _prepared(DataLoader(data, batch_size=3, shuffle=True, drop_last=True))
    assert mixed.shuffle and mixed.drop_last and len(_order(mixed)) == 9
    assert _order(mixed) != list(range(9)), "a RandomSampler: shuffled"
    assert _prepared(DataLoader(data, batch_size=3, shuffle=True), shuffle=False, drop_last=True).drop_last
    assert not _prepared(DataLoader(data, batch_size=3, shuffle=True), shuffle=False).shuffle
    assert not _prepared(data, batch_size=3).shuffle and not _prepared(data, batch_size=3).drop_last


def test_a_dataloader_s_worker_settings_reach_its_worker_processes():
    from torch.utils.data import DataLoader

    def init(worker_id):
        pass

    loader = _prepared(DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1, worker_init_fn=init, prefetch_factor=3))
    assert loader.num_workers == 1 and loader.worker_options["worker_init_fn"] is init
    assert loader.worker_options["prefetch_factor"] == 3
    assert _order(loader) == list(range(8)), "its worker process loads with them"
    assert "worker_init_fn" not in _prepared(DataLoader(TensorDataset(torch.arange(8)), batch_size=4)).worker_options


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: torch.utils.data.distributed.DistributedSampler(d, num_replicas=2, rank=0), "has a DistributedSampler: prepare_loader shards"),
        (lambda d: torch.utils.data.WeightedRandomSampler(torch.ones(len(d)), len(d)), r"cannot keep the DataLoader's sampler \(WeightedRandomSampler\)"),
        (lambda d: torch.utils.data.RandomSampler(d, replacement=True), "with replacement or num_samples"),
        (lambda d: torch.utils.data.SubsetRandomSampler([0, 2, 4]), r"SubsetRandomSampler \(it would read the whole dataset\): pass torch.utils.data.Subset"),
    ],
    ids=["distributed", "weighted", "replacement", "subset"],
)
def test_a_sampler_the_loader_cannot_keep_is_named(make, match):
    from torch.utils.data import DataLoader

    data = TensorDataset(torch.arange(10))
    with pytest.raises(TypeError, match=match):
        _prepared(DataLoader(data, batch_size=2, sampler=make(data)))


def test_a_custom_batch_sampler_and_a_stream_are_refused_with_what_to_do():
    from torch.utils.data import DataLoader, IterableDataset

    data = TensorDataset(torch.arange(10))
    with pytest.raises(TypeError, match=r"batch_sampler \(list\)"):
        _prepared(DataLoader(data, batch_sampler=[[0, 1], [2, 3]]))

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(TypeError, match=r"IterableDataset Stream\. Give each worker its own part"):
        _prepared(Stream(), batch_size=2)

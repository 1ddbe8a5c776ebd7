import pytest
import torch

from raylight.data.loader import GlobalBatchSampler, move_to_device


def _epoch(n, bs, k, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    per_rank = []
    for r in range(k):
        s = GlobalBatchSampler(n, batch_size=bs, rank=r, world_size=k, shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        per_rank.append(list(s))
    return per_rank


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_each_global_batch_is_the_single_process_batch(k):
    n, bs = 96, 12
    single = _epoch(n, bs, 1)[0]
    shards = _epoch(n, bs, k)
    assert all(len(s) == len(single) for s in shards)
    for step, batch in enumerate(single):
        assert sorted(i for r in range(k) for i in shards[r][step]) == sorted(batch)


@pytest.mark.parametrize("n,bs,k", [(100, 16, 2), (101, 10, 4), (7, 4, 3), (50, 8, 3)])
def test_epoch_covers_every_sample_once(n, bs, k):
    shards = _epoch(n, bs, k)
    steps = {len(s) for s in shards}
    assert len(steps) == 1, "every rank must take the same number of steps"
    seen = [i for s in shards for b in s for i in b]
    assert set(seen) == set(range(n))
    # Repeats only when the tail has fewer samples than workers.
    tail = n % ((bs // k) * k)
    extra = k - tail if 0 < tail < k else 0
    assert len(seen) == n + extra


def test_drop_last_and_order():
    shards = _epoch(10, 4, 2, shuffle=False, drop_last=True)
    assert shards == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_epochs_reshuffle_deterministically():
    a = _epoch(64, 8, 2, epoch=0)
    b = _epoch(64, 8, 2, epoch=1)
    assert a != b
    assert a == _epoch(64, 8, 2, epoch=0)
    assert a != _epoch(64, 8, 2, epoch=0, seed=1)


def test_batch_smaller_than_world_is_an_error():
    with pytest.raises(ValueError, match="at least the number of workers"):
        GlobalBatchSampler(10, batch_size=2, rank=0, world_size=4, shuffle=False)
    with pytest.raises(ValueError, match="empty"):
        GlobalBatchSampler(0, batch_size=2, rank=0, world_size=1, shuffle=False)


def test_move_to_device_nested():
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), 3], "s": "k"}
    out = move_to_device(batch, torch.device("cpu"))
    assert torch.equal(out["x"], batch["x"]) and out["y"][1] == 3 and out["s"] == "k"

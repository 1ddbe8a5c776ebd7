"""raylight.horovod on two gloo ranks: a collective the ranks disagree on (another shape, a
refused input, another op) raises on both and the group stays in step; int16 (which gloo
refuses) works; process sets, the grouped and reduce-scatter ops, sparse reductions and
the gradients of the ops; DistributedOptimizer reduces in one fixed order when the ranks'
backward passes differ (Horovod's test_force_allreduce, which aborted rank 1). And the
rank variables `python -m raylight.horovod` sets under torchrun's."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import raylight.horovod as hvd
from raylight.worker.hvd import compat
from raylight.worker.process_group import detect
from tests.helpers import run_gloo_ranks


def _env_rank(rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def _error(call) -> str:
    try:
        call()
    except (RuntimeError, ValueError) as exc:  # NotImplementedError is a RuntimeError
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _mismatch_rank(rank: int, port: int, queue) -> None:
    _env_rank(rank, port)
    hvd.init()
    try:
        got = {
            "shape": _error(lambda: hvd.allreduce(torch.ones(3 + rank))),
            "dtype": _error(lambda: hvd.allgather(torch.ones(2, dtype=torch.int32 if rank else torch.float32))),
            # rank 1's splits are wrong: it raises its ValueError, rank 0 a RuntimeError naming it
            "refused": _error(lambda: hvd.alltoall(torch.ones(2), splits=[1, 1] if rank == 0 else [5, 5])),
            "op": _error(lambda: hvd.barrier() if rank else hvd.broadcast(torch.ones(1), root_rank=0)),
            "adasum": _error(lambda: hvd.reducescatter(torch.ones(4), op=hvd.Adasum)),
        }
        # still in step: the next collectives run
        got["after"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).tolist()
        got["int16"] = hvd.allreduce(torch.tensor([300, -7], dtype=torch.int16) * (rank + 1), op=hvd.Sum).tolist()
        got["int16_dtype"] = str(hvd.allgather(torch.ones(1, dtype=torch.int16)).dtype)
        # join: rank 0 waits, adding zeros to rank 1's allreduce; rank 1's allgather raises
        if rank == 0:
            got["join"] = hvd.join()
        else:
            got["joined_sum"] = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
            got["joined_gather"] = _error(lambda: hvd.allgather(torch.ones(1)))
            got["join"] = hvd.join()
        got["after_join"] = hvd.allreduce(torch.tensor([2.0])).tolist()
        queue.put({"rank": rank, **got})
    finally:
        hvd.shutdown()


@pytest.mark.distributed
def test_a_collective_the_ranks_disagree_on_raises_on_both_and_the_next_one_runs():
    got = run_gloo_ranks(_mismatch_rank)
    for r in (0, 1):
        g = got[r]
        assert g["shape"].startswith("RuntimeError: hvd.allreduce: the ranks disagree on the shape"), g["shape"]
        assert "rank 0: allreduce of a cpu float32 tensor of shape [3]; rank 1: allreduce" in g["shape"]
        assert g["dtype"].startswith("RuntimeError: hvd.allgather: the ranks disagree on the"), g["dtype"]
        assert g["op"].startswith("RuntimeError:") and "disagree on the op" in g["op"], g["op"]
        assert g["adasum"].startswith("NotImplementedError: hvd.reducescatter: op=hvd.Adasum is not supported"), g["adasum"]
        assert g["after"] == [1.0]
        assert g["int16"] == [900, -21] and g["int16_dtype"] == "torch.int16"
    assert got[0]["join"] == got[1]["join"] == 1  # the last to join
    assert got[1]["joined_sum"] == [1.0, 1.0] and got[0]["after_join"] == got[1]["after_join"] == [2.0]
    assert got[1]["joined_gather"].startswith("RuntimeError: hvd.allgather: rank 0 has called hvd.join()")
    assert got[1]["refused"].startswith("ValueError: hvd.alltoall: splits=[5, 5]"), got[1]["refused"]
    assert got[0]["refused"].startswith("RuntimeError: hvd.alltoall: rank 1 refused its input"), got[0]["refused"]


def _ops_rank(rank: int, port: int, queue) -> None:
    _env_rank(rank, port)
    hvd.init()
    try:
        got: dict = {}
        ps = [hvd.add_process_set([0]), hvd.add_process_set([1])]
        mine = ps[rank]
        got["set"] = (mine.size(), mine.rank(), hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum,
                                                               process_set=mine).tolist())
        hvd.remove_process_set(ps[1])
        hvd.remove_process_set(ps[0])
        t = torch.arange(4.0) * (rank + 1)
        got["reducescatter"] = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).tolist()
        h = hvd.reducescatter_async(t, op=hvd.Average)
        got["reducescatter_async"] = hvd.synchronize(h).tolist()
        got["grouped_reducescatter"] = [x.tolist() for x in hvd.grouped_reducescatter([t, t + 1], op=hvd.Sum)]
        got["grouped_allgather"] = [x.tolist() for x in hvd.grouped_allgather([torch.tensor([rank]),
                                                                                torch.ones(rank + 1)])]
        sparse = torch.zeros(3, 2)
        sparse[rank] = 1.0
        got["sparse"] = hvd.sparse_allreduce_async(sparse.to_sparse(), op=hvd.Sum)().to_dense().tolist()
        x = torch.ones(2, requires_grad=True)
        (hvd.allreduce(x, op=hvd.Sum) * 3).sum().backward()
        got["allreduce_grad"] = x.grad.tolist()
        y = torch.full((rank + 1,), 1.0, requires_grad=True)
        hvd.allgather(y).sum().backward()
        got["allgather_grad"] = y.grad.tolist()
        queue.put({"rank": rank, **got})
    finally:
        hvd.shutdown()


@pytest.mark.distributed
def test_process_sets_reducescatter_grouped_sparse_and_gradients():
    got = run_gloo_ranks(_ops_rank)
    # the sum of [0,1,2,3] and [0,2,4,6], times 2 then 0.5: rank 0 gets the first half
    assert got[0]["reducescatter"] == [0.0, 3.0] and got[1]["reducescatter"] == [6.0, 9.0]
    assert got[0]["reducescatter_async"] == [0.0, 1.5] and got[1]["reducescatter_async"] == [3.0, 4.5]
    assert got[1]["grouped_reducescatter"] == [[6.0, 9.0], [8.0, 11.0]]
    for r in (0, 1):
        g = got[r]
        assert g["set"] == (1, 0, [r + 1.0])  # a set of one: this rank alone
        assert g["grouped_allgather"] == [[0, 1], [1.0, 1.0, 1.0]]
        assert g["sparse"] == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
        assert g["allreduce_grad"] == [6.0, 6.0]  # d(3 * sum over ranks)/dx: the ones times 3, summed
        assert g["allgather_grad"] == [1.0] * (r + 1)  # the average of the ranks' (equal) gradients, its rows


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc2(torch.relu(self.fc1(x)))
        return h, self.fc3(torch.relu(h))


def _order_rank(rank: int, port: int, queue) -> None:
    _env_rank(rank, port)
    hvd.init()
    try:
        torch.manual_seed(0)
        model = _TwoHeads()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        out1, out2 = model(torch.ones(5, 4))
        (out1 if rank == 0 else out2).sum().backward()  # rank 0's backward never reaches fc3
        opt.step()
        queue.put({"rank": rank, "params": {k: v.tolist() for k, v in model.state_dict().items()}})
    finally:
        hvd.shutdown()


@pytest.mark.distributed
def test_the_optimizer_reduces_in_one_order_when_the_ranks_backward_passes_differ():
    got = run_gloo_ranks(_order_rank)
    assert got[0]["params"] == got[1]["params"]
    torch.manual_seed(0)
    model = _TwoHeads()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out1, out2 = model(torch.ones(5, 4))
    ((out1.sum() + out2.sum()) / 2).backward()  # the average of the two ranks' losses
    for name, p in model.named_parameters():
        want = before[name] - 0.1 * p.grad
        assert torch.allclose(torch.tensor(got[0]["params"][name]), want, atol=1e-6), name


def test_rank_variables_are_set_from_torchruns_and_detect_still_reads_torchruns():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "run", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    added = compat.set_rank_variables(env)
    assert added == {k: env[k] for k in added}
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_CROSS_SIZE"]) == \
        ("1", "2", "1", "1")
    assert (env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"], env["OMPI_COMM_WORLD_LOCAL_SIZE"]) == \
        ("1", "2", "2")
    launch = detect(env)
    assert launch is not None and launch.launcher == "torchrun" and launch.rank == 1
    assert compat.set_rank_variables(env) == {}  # already set: nothing changes
    assert compat.set_rank_variables({"RANK": "0", "WORLD_SIZE": "1"}) == {}  # not torchrun's: nothing

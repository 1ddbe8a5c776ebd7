"""A Horovod script for `raylight run -m raylight.horovod` across hosts
(tests/hosts/test_horovod_over_hosts.py): each rank trains on its own batch through
``hvd.DistributedOptimizer`` and prints its hostname; rank 0 saves the parameters to OUT.

    raylight run -n 2 -m raylight.horovod horovod_script.py OUT
"""

import socket
import sys

import torch
from torch import nn

STEPS = 8


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4) * 0.01 * (step + 1) + rank
    return x, x.sum(dim=1, keepdim=True) * 0.1


def train(model: nn.Module, opt: torch.optim.Optimizer, ranks: list[int]) -> None:
    """The steps of the ranks in ``ranks`` (one process: all their batches at once)."""
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*(batch(step, r) for r in ranks), strict=True)
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()


def main(out: str) -> None:
    import horovod.torch as hvd  # raylight.horovod's, under -m raylight.horovod

    hvd.init()
    print("HOST", hvd.rank(), socket.gethostname(), flush=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    train(model, opt, [hvd.rank()])
    if hvd.rank() == 0:
        torch.save(model.state_dict(), out)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])

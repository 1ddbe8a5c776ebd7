"""Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py pattern, on synthetic data:
state committed every few batches, ``@hvd.elastic.run`` retrying from the last commit.

Run:  raylight run -n 2 --max-failures 3 -m raylight.horovod examples/horovod/pytorch_elastic.py
      horovodrun --gloo -np 2 python -m raylight.horovod examples/horovod/pytorch_elastic.py
Needs: pip install raylight (no Horovod: raylight.horovod serves `import horovod.torch`)

``--fail-at-batch N`` makes every rank raise ``HorovodInternalError`` once, at batch N of
the first epoch, after uncommitted progress: what a failed collective raises. The run
restores the last commit, re-forms the group and ends with the parameters of a run that
never failed. Each global batch is a fixed slice of the epoch's order (``state.batch``
says which), so a resumed run sees the batches a run without failure does.
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from pytorch_mnist import Net, synthetic_mnist  # beside this script (its directory is on sys.path)
from torch import optim

parser = argparse.ArgumentParser(description="PyTorch elastic example (synthetic data)")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--samples", type=int, default=256)
parser.add_argument("--batches-per-commit", type=int, default=2)
parser.add_argument("--fail-at-batch", type=int, default=-1)
parser.add_argument("--save", default="")


def batches(dataset, epoch: int, seed: int, batch_size: int) -> tuple[torch.Tensor, int]:
    """This epoch's sample order (the same on every rank) and its number of global batches."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed + epoch))
    return order, len(dataset) // (batch_size * hvd.size())


def main(args: argparse.Namespace) -> None:
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dataset = synthetic_mnist(args.samples, args.seed)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    resets = []

    def on_state_reset() -> None:  # the new size's learning rate
        resets.append(hvd.size())
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])
    failed = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch <= args.epochs:
            order, steps = batches(dataset, state.epoch, args.seed, args.batch_size)
            while state.batch < steps:  # state.batch: the next global batch of this epoch
                first = (state.batch * hvd.size() + hvd.rank()) * args.batch_size
                data, target = dataset[order[first : first + args.batch_size]]
                optimizer.zero_grad()
                F.nll_loss(model(data), target).backward()
                optimizer.step()
                state.batch += 1
                if state.epoch == 1 and state.batch == args.fail_at_batch and not failed:
                    failed.append(state.batch)  # after a step no commit holds
                    raise hvd.HorovodInternalError(f"injected after batch {state.batch}")
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"done: {hvd.size()} ranks, resets {resets}")
        if args.save:
            torch.save({"model": model.state_dict(), "resets": resets}, args.save)
    hvd.shutdown()


if __name__ == "__main__":
    main(parser.parse_args())

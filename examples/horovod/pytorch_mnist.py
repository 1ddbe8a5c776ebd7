"""Horovod's examples/pytorch/pytorch_mnist.py, on synthetic MNIST-shaped data (no download).

An unchanged Horovod script: under `python -m raylight.horovod`, `import horovod.torch as hvd`
is served by raylight.horovod through its import hook (installed Horovod or not); run as
`python pytorch_mnist.py` where Horovod is installed, it is real Horovod.

Run:  raylight run -n 2 -m raylight.horovod examples/horovod/pytorch_mnist.py
      mpirun -np 2 python -m raylight.horovod examples/horovod/pytorch_mnist.py
      horovodrun --gloo -np 2 python -m raylight.horovod examples/horovod/pytorch_mnist.py
      python -m raylight.horovod examples/horovod/pytorch_mnist.py        (one process)

Needs: pip install raylight (no Horovod: raylight.horovod serves `import horovod.torch`)
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torch import nn, optim

parser = argparse.ArgumentParser(description="PyTorch MNIST-style example (synthetic data)")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size for training (per rank)")
parser.add_argument("--epochs", type=int, default=2, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--samples", type=int, default=256, help="synthetic training samples")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0, help="apply gradient predivide factor")
parser.add_argument("--save", default="", help="rank 0 saves the trained state_dict here")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=5)
        self.fc1 = nn.Linear(128, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_mnist(samples: int, seed: int) -> torch.utils.data.TensorDataset:
    """MNIST-shaped (1x28x28, 10 classes) images whose class shifts their mean."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = torch.randn(samples, 1, 28, 28, generator=g) + labels.view(-1, 1, 1, 1) * 0.1
    return torch.utils.data.TensorDataset(images, labels)


def metric_average(val: float, name: str) -> float:
    avg_tensor = hvd.allreduce(torch.tensor(val), name=name)
    return avg_tensor.item()


def main(args: argparse.Namespace) -> None:
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = synthetic_mnist(args.samples, args.seed)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    model = Net()
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
    )

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        total = 0.0
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            total += loss.item()
        avg = metric_average(total / len(train_loader), "avg_loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {avg:.4f} ({hvd.size()} ranks)")

    if args.save and hvd.rank() == 0:
        torch.save(model.state_dict(), args.save)
    hvd.shutdown()


if __name__ == "__main__":
    main(parser.parse_args())

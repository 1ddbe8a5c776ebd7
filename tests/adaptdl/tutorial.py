"""AdaptDL's MNIST tutorial (step 5: the adaptive batch, the epoch loop, the Accumulator),
written the way AdaptDL users write it, on scikit-learn's bundled digits (no download).
The tests write it to a file and run it under `raylight run` or one plain process."""

TUTORIAL = r'''
import argparse, json, os, signal

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.optim.lr_scheduler import StepLR

import adaptdl
import adaptdl.env
import adaptdl.torch as adl


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if (args.kill_in_epoch == epoch and batch_idx == 3 and adaptdl.env.replica_rank() == 1
                and adaptdl.env.num_restarts() == 0):
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-epoch


def test(model, device, test_loader, sizes):
    model.eval()
    stats = adl.Accumulator()
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data.to(device))
            stats["test_loss"] += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            stats["correct"] += pred.eq(target.view_as(pred)).sum().item()
    with stats.synchronized():
        accuracy = stats["correct"] / len(test_loader.dataset)
        print(f"epoch {adl.current_epoch()} accuracy {accuracy:.4f} batch {sizes}", flush=True)
        return accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--kill-in-epoch", type=int, default=-1)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.manual_seed(1)
    device = torch.device("cpu")

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    dataset1 = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    dataset2 = torch.utils.data.TensorDataset(x[1400:], y[1400:])

    adl.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    print(f"replica {adaptdl.env.replica_rank()} of {adaptdl.env.num_replicas()} restart {adaptdl.env.num_restarts()} "
          f"starts at epoch {adl.finished_epochs()}", flush=True)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    model = adl.AdaptiveDataParallel(model, optimizer, scheduler)

    train_loader = adl.AdaptiveDataLoader(dataset1, batch_size=32, shuffle=True, drop_last=True)
    test_loader = adl.AdaptiveDataLoader(dataset2, batch_size=100)
    train_loader.autoscale_batch_size(512, local_bsz_bounds=(8, 128), gradient_accumulation=True)

    accuracy, sizes = 0.0, []
    for epoch in adl.remaining_epochs_until(args.epochs):
        train(args, model, device, train_loader, optimizer, epoch)
        sizes.append(train_loader.current_batch_size)
        accuracy = test(model, device, test_loader, sizes)
        scheduler.step()
    if args.out and adaptdl.env.replica_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"accuracy": accuracy, "sizes": sizes, "gain": model.gain,
                       "accumulation_steps": train_loader.accumulation_steps}, f)


if __name__ == "__main__":
    main()
'''

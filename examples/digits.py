"""Train a digit classifier data-parallel on an embedded local Ray cluster.

Run:  python examples/digits.py            (or `make run`)
      python examples/digits.py --workers 2 --epochs 15 --quiet

Data: scikit-learn's bundled 8x8 digits (1,797 images), no download. Two workers
train an MLP with DDP over gloo; each epoch is checkpointed, and the final accuracy
on a held-out split is printed.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

import raylight


def load_data(seed: int = 0):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def train_loop(ctx: raylight.TrainContext, config: dict) -> None:
    train, test = load_data()
    model = ctx.prepare_model(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loader = ctx.prepare_loader(train, batch_size=config["batch_size"], shuffle=True)
    start = 0
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        model.train()
        total, count = 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            count += len(y)
        model.eval()
        with torch.no_grad():
            xt, yt = test.tensors
            acc = (model(xt.to(ctx.device)).argmax(1).cpu() == yt).float().mean().item()
        ctx.report(
            {"epoch": epoch, "loss": ctx.all_reduce(total / count), "test_accuracy": acc},
            checkpoint={
                "model": ctx.unwrap_model(model).state_dict(),
                "opt": opt.state_dict(),
                "epoch": epoch,
            },
        )


def main(argv: list[str] | None = None) -> raylight.Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--storage", default=None, help="run storage (default: a temp dir)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    storage = args.storage or tempfile.mkdtemp(prefix="raylight-digits-")
    result = raylight.fit(
        train_loop,
        config={"lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs},
        num_workers=args.workers,
        storage_path=storage,
        name="digits",
        progress=not args.quiet,
    )
    m = result.metrics
    print(
        f"\ndigits: {args.workers} workers, {len(result.metrics_history)} epochs, "
        f"final loss {m['loss']:.4f}, test accuracy {100 * m['test_accuracy']:.2f}%"
    )
    print(f"run directory: {result.path}")
    return result


if __name__ == "__main__":
    main()

"""Train a digit classifier data-parallel and adaptively on an embedded local Ray cluster.

Run:  python examples/digits.py            (or `make run-digits`)
      python examples/digits.py --workers 2 --epochs 15 --fixed --quiet
      python examples/digits.py --strategy fsdp     (sharded: FSDP2, sharded checkpoints)
      raylight submit --name d1 --retries 2 -d examples -- python digits.py --storage /shared/runs
          (on a cluster: the job's name d1 wins over name="digits" below, so a retry resumes
          run d1; --storage must outlive the attempt, docs/cluster.md)
Needs: pip install 'raylight[examples]'

Data: scikit-learn's bundled 8x8 digits (1,797 images), no download. Two workers train
an MLP with DDP over gloo. With the adaptive engine on (the default), the global batch
size, gradient accumulation and the learning-rate factor (AdaScale) are chosen online
from measured step times and gradient noise; `--fixed` keeps the batch at its initial
size. Each epoch is checkpointed (the model and optimizer given as objects, so the same
loop checkpoints and resumes under DDP and FSDP); the end prints a report with the final
held-out accuracy and how the batch size evolved (the run directory also has adaptive.png).
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
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    ctx.load_checkpoint({"model": model, "opt": opt})  # a restart resumes them (None at first)
    loader = ctx.prepare_loader(train, batch_size=config["batch_size"], shuffle=True, adaptive=True)
    stats = ctx.accumulator()
    loss_fn = nn.CrossEntropyLoss()
    for epoch in ctx.epochs(config["epochs"]):
        model.train()
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            stats[f"loss{epoch}"] += loss.detach() * len(y)  # summed on the device, read once an epoch
            stats[f"seen{epoch}"] += len(y)
        model.eval()
        with torch.no_grad():
            xt, yt = test.tensors
            acc = (model(xt.to(ctx.device)).argmax(1).cpu() == yt).float().mean().item()
        with stats.synchronized():
            mean_loss = stats[f"loss{epoch}"] / stats[f"seen{epoch}"]
        ctx.report(
            {"epoch": epoch, "loss": mean_loss, "test_accuracy": acc, "batch_size": ctx.batch_size},
            checkpoint={"model": model, "opt": opt},
        )


def main(argv: list[str] | None = None) -> raylight.Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--fixed", action="store_true", help="keep the batch size fixed")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp", help="replicate or shard the model")
    parser.add_argument("--storage", default=None, help="run storage (default: a temp dir)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    storage = args.storage or tempfile.mkdtemp(prefix="raylight-digits-")
    adaptive = None
    if not args.fixed:
        adaptive = raylight.AdaptiveConfig(
            max_batch_size=512, local_batch_bounds=(8, 128), lr_rule="adascale", decision_interval_s=1.0
        )
    result = raylight.fit(
        train_loop,
        config={"lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs},
        num_workers=args.workers,
        adaptive=adaptive,
        strategy=args.strategy,
        storage_path=storage,
        name="digits",
        progress=not args.quiet,
    )
    history = [m for m in result.metrics_history if "test_accuracy" in m]
    m = history[-1]
    batches = [h["batch_size"] for h in history]
    print(
        f"\ndigits: {args.workers} {args.strategy} workers, {len(history)} epochs, "
        f"{'adaptive' if adaptive else 'fixed'} batch {batches[0]} -> {batches[-1]}, "
        f"final loss {m['loss']:.4f}, test accuracy {100 * m['test_accuracy']:.2f}%"
    )
    print(f"run directory: {result.path} (metrics.jsonl, adaptive.jsonl, adaptive.png, checkpoints/)")
    return result


if __name__ == "__main__":
    main()

"""Train a digit classifier with DeepSpeed ZeRO-2 on two CPU workers of an embedded Ray.

Run:  python examples/deepspeed_mlp.py
      python examples/deepspeed_mlp.py --stage 3 --epochs 5
      python examples/deepspeed_mlp.py --offload     (optimizer state stepped in CPU memory)
Needs: pip install 'raylight[deepspeed,examples]'

Data: scikit-learn's bundled 8x8 digits (1,797 images), no download. The loop is the
README's DDP loop, unchanged: `loss.backward()` and `opt.step()` run through the DeepSpeed
engine that `ctx.prepare_optimizer` builds (ZeRO-2: each worker keeps half of the
gradients and of Adam's state). DeepSpeed's batch fields come from
`prepare_loader(batch_size=...)`. Each epoch is checkpointed with the model and optimizer
as objects: every worker writes its shards, and the checkpoint loads under DDP and FSDP
too. The first run compiles DeepSpeed's CPU ops (~30-45 s, cached afterwards).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch import nn
from torch.utils.data import TensorDataset

import raylight


def load_data(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits  # on the workers: the driver does not need it
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def train_loop(ctx: raylight.TrainContext, config: dict) -> None:
    train, test = load_data()
    model = ctx.prepare_model(make_model())  # the engine's module is model.module
    opt = ctx.prepare_optimizer(torch.optim.AdamW(model.parameters(), lr=config["lr"]))  # builds the engine
    rest = ctx.load_checkpoint({"model": model, "opt": opt})  # a restart resumes them (None at first)
    loader = ctx.prepare_loader(train, batch_size=config["batch_size"], shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(rest["epoch"] + 1 if rest else 0, config["epochs"]):
        loader.set_epoch(epoch)
        model.train()
        total, seen = 0.0, 0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # or model.backward(loss): DeepSpeed's engine.backward
            opt.step()  # the engine's step
            total, seen = total + loss.item() * len(y), seen + len(y)
        model.eval()
        with torch.no_grad():
            xt, yt = test.tensors
            acc = (model(xt.to(ctx.device)).argmax(1).cpu() == yt).float().mean().item()
        ctx.report(
            {"epoch": epoch, "loss": ctx.all_reduce(total / seen), "test_accuracy": acc,
             "zero_stage": model.engine.zero_optimization_stage(), "world_size": ctx.world_size},
            checkpoint={"epoch": epoch, "model": model, "opt": opt},
        )


def main(argv: list[str] | None = None) -> raylight.Result:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--stage", type=int, choices=[1, 2, 3], default=2, help="ZeRO stage")
    parser.add_argument("--offload", action="store_true", help="keep the optimizer state in CPU memory")
    parser.add_argument("--storage", default=None, help="run storage (default: a temp dir)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    result = raylight.fit(
        train_loop,
        config={"lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs},
        num_workers=args.workers,
        strategy=raylight.DeepSpeed(stage=args.stage, offload_optimizer=args.offload),
        storage_path=args.storage or tempfile.mkdtemp(prefix="raylight-deepspeed-"),
        name="deepspeed_mlp",
        progress=not args.quiet,
    )
    m = result.metrics
    print(
        f"\ndeepspeed_mlp: ZeRO-{m['zero_stage']} on {args.workers} workers, {m['epoch'] + 1} epochs, "
        f"final loss {m['loss']:.4f}, test accuracy {100 * m['test_accuracy']:.2f}%"
    )
    print(f"run directory: {result.path} (metrics.jsonl, checkpoints/: each worker's shards)")
    return result


if __name__ == "__main__":
    main()

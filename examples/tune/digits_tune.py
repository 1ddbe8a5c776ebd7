"""Hyperparameter search on Ray Tune where every trial is a 2-worker raylight job.

Run:  python examples/tune/digits_tune.py                       (8 trials, ASHA)
      python examples/tune/digits_tune.py --num-samples 2 --epochs 2 --workers 1
Needs: pip install 'raylight[tune,examples]'

The raylight version of ray_lightning's README Tune example: a classifier of
scikit-learn's bundled 8x8 digits (no download), its learning rate and width searched
by Tune with the ASHA scheduler. Each trial's resources are an empty head bundle for
the trial driver plus one bundle per worker (`raylight.tune.get_tune_resources`), and
raylight places its workers in those bundles. `ctx.report` on the workers reaches
`ray.tune.report`, with each checkpoint as a `ray.tune.Checkpoint`.
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


def load_data():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return TensorDataset(x_tr, y_tr), (x_va, y_va)


def train_digits(ctx: raylight.TrainContext, config: dict) -> None:
    train, (x_va, y_va) = load_data()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 10))
    model = ctx.prepare_model(net)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if (ckpt := ctx.get_checkpoint()) is not None:  # PBT, or a resumed experiment
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    loader = ctx.prepare_loader(train, batch_size=64, shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in ctx.epochs(config["epochs"]):
        model.train()
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            out = ctx.unwrap_model(model)(x_va)
            val_loss = float(loss_fn(out, y_va))
            accuracy = float((out.argmax(1) == y_va).float().mean())
        ctx.report(
            {"epoch": epoch, "loss": val_loss, "accuracy": accuracy},
            checkpoint={"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()},
        )


def main(argv: list[str] | None = None) -> dict:
    from ray import tune

    import raylight.tune as rt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the search (which configs are sampled)")
    parser.add_argument("--storage", default=None, help="Tune's storage_path (default: a temporary directory)")
    args = parser.parse_args(argv)

    rt.connect()  # an embedded local Ray unless RAY_ADDRESS is set, as raylight.fit does
    trainable = rt.trainable(train_digits, num_workers=args.workers, base_config={"epochs": args.epochs})
    plan = rt.check_resources(trainable, num_trials=args.num_samples)  # fails fast if a trial never fits
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.loguniform(2e-2, 3e-1), "hidden": tune.choice([32, 64, 128])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=args.num_samples,
            # The seeded generator holds the plan's trials-at-once itself: Tune ignores
            # max_concurrent_trials (with a warning) for a search algorithm like this one.
            search_alg=tune.search.BasicVariantGenerator(random_state=args.seed, max_concurrent=plan.max_concurrent),
            scheduler=tune.schedulers.ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2),
            reuse_actors=True,  # the next trial runs in this trial's process, on its warm workers
        ),
        run_config=tune.RunConfig(storage_path=args.storage or tempfile.mkdtemp(prefix="digits-tune-"), name="tune_digits", verbose=1),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best config: {best.config}  loss {best.metrics['loss']:.4f}  accuracy {best.metrics['accuracy']:.3f}")
    return {"best_config": best.config, "best_metrics": best.metrics, "num_trials": len(results), "errors": len(results.errors)}


if __name__ == "__main__":
    main()

"""Tune a Lightning model whose every trial trains on raylight workers: the raylight
version of ray_lightning's README Tune example (here scikit-learn's 8x8 digits, no download).

Run:  python examples/lightning/tune_digits.py
      python examples/lightning/tune_digits.py --num-samples 2 --epochs 2 --num-workers 2
Needs: pip install 'raylight[lightning,tune,examples]'

Each trial is a Tune trainable that builds a ``pl.Trainer`` with ``RayStrategy``: the
trial's resources (``get_tune_resources``) are an empty head bundle for the trial's
process plus one bundle per worker, and raylight places its workers in those bundles.
``TuneReportCheckpointCallback`` runs on the workers; rank 0's report reaches Tune from
the trial's process, with the Lightning checkpoint as a ``ray.tune.Checkpoint``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from typing import Any

import lightning.pytorch as pl
import ray.cloudpickle
from ray import tune

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_digits

from raylight.lightning import RayStrategy
from raylight.tune import (
    TuneReportCheckpointCallback,
    check_resources,
    connect,
    get_tune_resources,
)

# Trials and workers unpickle the model from this example without importing its file.
ray.cloudpickle.register_pickle_by_value(ddp_digits)

CHECKPOINT = "checkpoint.ckpt"


def train_digits(config: dict[str, Any], *, num_workers: int, epochs: int) -> None:
    """One trial: a Lightning fit on ``num_workers`` raylight workers."""
    model = ddp_digits.DigitsClassifier(hidden=config["hidden"], lr=config["lr"])
    trainer = pl.Trainer(
        max_epochs=epochs,
        strategy=RayStrategy(num_workers=num_workers),
        callbacks=[
            TuneReportCheckpointCallback({"loss": "val_loss", "acc": "val_acc"}, filename=CHECKPOINT)
        ],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    restored = tune.get_checkpoint()  # a trial Tune restarts (or PBT's exploit)
    if restored is None:
        trainer.fit(model, datamodule=ddp_digits.DigitsDataModule())
    else:
        with restored.as_directory() as d:
            trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(), ckpt_path=os.path.join(d, CHECKPOINT))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--storage-path", default=None, help="Tune results (default: a temp dir)")
    args = parser.parse_args(argv)

    connect()  # the running Ray, RAY_ADDRESS, or an embedded local one on 127.0.0.1
    resources = get_tune_resources(num_workers=args.num_workers)
    plan = check_resources(resources, num_trials=args.num_samples)  # fails fast if it never fits
    trainable = tune.with_resources(
        functools.partial(train_digits, num_workers=args.num_workers, epochs=args.epochs), resources
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.loguniform(1e-3, 0.3), "hidden": tune.choice([32, 64])},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=args.num_samples, max_concurrent_trials=plan.max_concurrent,
            reuse_actors=True,  # the next trial runs in this trial's process, on its warm workers
        ),
        run_config=tune.RunConfig(
            name="lightning-digits",
            storage_path=args.storage_path or tempfile.mkdtemp(prefix="raylight-tune-lightning-"),
        ),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best config {best.config}: loss {best.metrics['loss']:.4f}, acc {best.metrics['acc']:.3f}")
    assert best.checkpoint is not None
    print(f"best checkpoint: {best.checkpoint.path}/{CHECKPOINT}")
    return {
        "best_config": best.config,
        "best_loss": best.metrics["loss"],
        "best_acc": best.metrics["acc"],
        "checkpoint": best.checkpoint,
        "trials": len(results),
        "errors": results.num_errors,
        "iterations": [r.metrics.get("training_iteration") for r in results],
    }


if __name__ == "__main__":
    main()

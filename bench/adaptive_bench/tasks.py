"""The tasks every run trains: the datasets (bundled with installed packages: no download,
nothing shipped through the config), the models, the optimizer and held-out accuracy."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

DATASETS = {
    "diamonds": "plotnine's bundled diamonds (53,940 rows): predict the 5-class cut from carat, "
    "depth, table, price, x, y, z (z-scored) and one-hot colour and clarity; 43,940 training and "
    "10,000 held-out rows (a fixed random split, seed 0); MLP 22 -> 64 -> 64 -> 5",
    "digits": "scikit-learn's bundled 8x8 digits: 1,347 training and 450 held-out images "
    "(stratified, random_state=0); MLP 64 -> 128 -> 10",
}


@functools.cache
def dataset_arrays(name: str, seed: int) -> tuple[Any, Any, Any, Any]:
    """(x_train, y_train, x_test, y_test) as numpy arrays; every process loads its own copy
    from the installed package, once (the workers import this module by name)."""
    import numpy as np

    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_tr, x_te, y_tr, y_te = train_test_split(
            digits.data / 16.0,
            digits.target,
            test_size=0.25,
            random_state=seed,
            stratify=digits.target,
        )
        return x_tr, y_tr, x_te, y_te
    if name == "diamonds":
        import pandas as pd
        import plotnine

        df = pd.read_csv(Path(plotnine.__file__).parent / "data" / "diamonds.csv")
        y = pd.Categorical(df["cut"]).codes.astype(np.int64)
        num = df[["carat", "depth", "table", "price", "x", "y", "z"]].astype(float)
        num = (num - num.mean()) / num.std()
        x = pd.concat(
            [num, pd.get_dummies(df["color"]), pd.get_dummies(df["clarity"])], axis=1
        ).to_numpy(np.float32)
        order = np.random.default_rng(seed).permutation(len(x))
        test, train = order[:10_000], order[10_000:]
        return x[train], y[train], x[test], y[test]
    raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")


def tensors(job: dict[str, Any], part: str) -> TensorDataset:
    x_tr, y_tr, x_te, y_te = dataset_arrays(job["dataset"], job["split_seed"])
    x, y = (x_tr, y_tr) if part == "train" else (x_te, y_te)
    return TensorDataset(
        torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)
    )


def synthetic(samples: int, seed: int) -> TensorDataset:
    """The throughput runs' data: Gaussian inputs labelled by a random linear teacher."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 64, generator=gen)
    teacher = torch.randn(64, 10, generator=gen)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def task_model(job: dict[str, Any]) -> nn.Module:
    torch.manual_seed(job["seed"])
    if job["dataset"] == "digits":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Linear(22, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)
    )


def throughput_model(job: dict[str, Any]) -> nn.Module:
    """The bigger MLP of the throughput runs, 64 -> hidden -> hidden -> 10."""
    torch.manual_seed(job["seed"])
    h = job["hidden"]
    return nn.Sequential(
        nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10)
    )


def sgd(model: nn.Module, job: dict[str, Any]) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])


def max_epochs(job: dict[str, Any]) -> int:
    """Epochs a run may take to spend its budget: the budget at the largest batch with no
    gain at all (AdaScale's gain is at least 1 per step, so never more)."""
    return job["epochs"] * math.ceil(
        job.get("max_batch_size", job["batch_size"]) / job["batch_size"]
    )


def accuracy(model: nn.Module, test: TensorDataset) -> float:
    module = getattr(model, "module", model)  # the DDP wrapper is not needed to evaluate
    x, y = test.tensors
    with torch.no_grad():
        return float((module(x).argmax(1) == y).float().mean())

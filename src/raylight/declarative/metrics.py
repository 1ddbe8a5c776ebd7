"""The metrics a declarative run measures each epoch, by output type and split, and
Ludwig's names for them: the one home of metric names for early stopping, the best model,
reductions on plateau and hyperparameter search."""

from __future__ import annotations

# Ludwig's metric names that are raylight's under another name.
METRIC_ALIASES = {"mean_squared_error": "mse", "mean_absolute_error": "mae", "accuracy_micro": "accuracy"}
# Metrics that improve as they fall; every other one improves as it rises.
MINIMIZED = frozenset({"loss", "mse", "mae"})


def metric_name(value: str) -> str:
    """``value`` in raylight's name (Ludwig's names accepted)."""
    return METRIC_ALIASES.get(value, value)


def metrics_measured(kind: str, split: str) -> list[str]:
    """The metrics each epoch measures of a ``kind`` output on ``split``."""
    if split == "training":
        return ["loss"]
    return {
        "binary": ["loss", "accuracy", "roc_auc"], "category": ["loss", "accuracy"], "number": ["loss", "mse", "mae", "r2"],
        "set": ["loss", "jaccard"],
    }[kind]

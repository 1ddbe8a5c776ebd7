"""The metrics a declarative run measures each epoch, by output type (each type's
``METRICS``) and split, and Ludwig's names for them: the one home of metric names for
early stopping, the best model, reductions on plateau and hyperparameter search."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from raylight.declarative.outputs import OUTPUTS

# Ludwig's metric names that are raylight's under another name.
METRIC_ALIASES = {
    "mean_squared_error": "mse", "mean_absolute_error": "mae", "root_mean_squared_error": "rmse", "accuracy_micro": "accuracy",
    "mean_absolute_percentage_error": "mape", "root_mean_squared_percentage_error": "rmspe",
}
# Metrics that improve as they fall; every other one improves as it rises.
MINIMIZED = frozenset({"loss", "mse", "mae", "rmse", "mape", "rmspe"})


def metric_name(value: str) -> str:
    """``value`` in raylight's name (Ludwig's names accepted)."""
    return METRIC_ALIASES.get(value, value)


def metrics_measured(kind: str, split: str) -> list[str]:
    """The metrics each epoch measures of a ``kind`` output on ``split``."""
    if split == "training":
        return ["loss"]
    return list(OUTPUTS[kind].METRICS)


COMBINED = "combined"  # Ludwig's name for all the outputs together (validation_field, hyperopt output_feature)


def field_metrics(outputs: Mapping[str, str], field: str, split: str) -> list[str]:
    """The metrics measured on ``split`` for ``field``: an output's name, or ``combined``.
    ``outputs``: each output's type by its name. One output's metrics are combined's too;
    with several, combined has only the loss (Ludwig's: the outputs' weighted losses added
    up)."""
    if field == COMBINED:
        return metrics_measured(next(iter(outputs.values())), split) if len(outputs) == 1 else ["loss"]
    return metrics_measured(outputs[field], split)


def metric_key(outputs: Collection[str], field: str, metric: str) -> str:
    """The key of ``field``'s ``metric`` among an evaluation's metrics (``evaluate_data``):
    the metric's name for a model of one output; with several, ``loss`` for combined and
    ``<output>/<metric>`` for an output's own."""
    if len(outputs) == 1:
        return metric
    return "loss" if field == COMBINED else f"{field}/{metric}"

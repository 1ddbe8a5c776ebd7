"""Declarative output feature types: one module each, ``OUTPUTS`` the family.

A type's module holds what ``OutputType`` lists: its config model, its column and target
checks (pandas and Ray Data), its fit and transform of the target, its decoder's width,
its loss, its prediction, the sums and metrics of an evaluation, and its prediction
columns. Everything that handles output features looks the type up here: config
validation (when validating, so an entry added later counts), preprocessing on pandas and
on Ray Data, the model, training, evaluation and prediction. A new type is one module and
one entry.
"""

from __future__ import annotations

from raylight.declarative.outputs import anomaly, binary, category, number, sets, timeseries, vector
from raylight.declarative.outputs.base import OutputModel, OutputType

# The order is that of the allowed types in the error for an unknown one.
OUTPUTS: dict[str, OutputType] = {
    "binary": binary, "category": category, "number": number, "set": sets, "vector": vector,
    "timeseries": timeseries, "anomaly": anomaly,
}

__all__ = ["OUTPUTS", "OutputModel", "OutputType"]

"""Declarative input feature types: one module each, ``FEATURES`` the family.

A type's module holds what ``FeatureType`` lists: its config model, its data checks, its
statistics (pandas and Ray Data), its transform to arrays, its encoder and its rule for
init-config. Everything that handles input features looks the type up here: config
validation (when validating, so an entry added later counts), preprocessing on pandas and
on Ray Data, the model and init-config. A new type is one module and one entry.
"""

from __future__ import annotations

import pandas as pd

from raylight.declarative.features import (
    bag,
    binary,
    category,
    date,
    image,
    number,
    sequence,
    sets,
    text,
    timeseries,
    vector,
)
from raylight.declarative.features.base import FeatureModel, FeatureType

# The order is that of the allowed types in the error for an unknown one.
FEATURES: dict[str, FeatureType] = {
    "number": number, "category": category, "binary": binary, "text": text, "date": date, "set": sets, "bag": bag,
    "vector": vector, "sequence": sequence, "timeseries": timeseries, "image": image,
}


def infer_type(values: pd.Series) -> str:
    """The type init-config gives a column of these (non-null) values: the first, by
    INFER_RANK, whose rule claims them."""
    for name, feature in sorted(FEATURES.items(), key=lambda item: item[1].INFER_RANK):
        if feature.infers(values):
            return name
    raise ValueError(f"no feature type claims a column of {values.dtype}; category claims any")


__all__ = ["FEATURES", "FeatureModel", "FeatureType", "infer_type"]

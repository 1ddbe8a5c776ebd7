"""Timeseries outputs, as Ludwig's: each row's target a series of future values (a cell of
numbers split by ``preprocessing.tokenizer``, or a list in Parquet or JSON), ``horizon``
of them (by default the longest training row's length, at most
``timeseries_length_limit``, Ludwig's), a shorter row padded with ``padding_value``; the
decoder is Ludwig's projector (one linear layer of ``horizon`` values), the loss Ludwig's
``huber`` (or ``mean_squared_error``, ``mean_absolute_error``) over every value, and the
metrics mse, mae, rmse over every value and r2 the mean of the steps' (Ludwig's, as a
vector's). Values are not scaled, as in Ludwig. A row without a series is dropped."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.config.base import ConfigModel
from raylight.declarative.features import timeseries as series_input
from raylight.declarative.features.base import bad_cells
from raylight.declarative.features.text import Tokenizer
from raylight.declarative.outputs import vector
from raylight.declarative.outputs.base import OutputModel, no_target_check, no_target_summary

if TYPE_CHECKING:
    import torch
    from torch import nn


class TimeseriesOutputPreprocessing(ConfigModel):
    tokenizer: Tokenizer = Field("space", description="How a cell splits into numbers (Ludwig's; default: on white space).")
    timeseries_length_limit: int = Field(256, ge=1, le=65_536, description="The most values kept of a row, from its start.")
    padding_value: float = Field(0.0, allow_inf_nan=False, description="What pads a shorter row.")
    padding: Literal["right", "left"] = Field("right", description="Which side a shorter row is padded on.")


class TimeseriesLoss(ConfigModel):
    type: Literal["huber", "mean_squared_error", "mean_absolute_error"] = Field(
        "huber", description="huber (Ludwig's default for timeseries), mean_squared_error or mean_absolute_error, over every value."
    )
    delta: float = Field(1.0, gt=0, le=1e9, description="huber: where the loss turns from squared to absolute.")


class TimeseriesOutput(OutputModel):
    type: Literal["timeseries"]
    horizon: int | None = Field(
        None, ge=1, le=65_536,
        description="timeseries: the future values predicted per row; null: the longest training row's (Ludwig's).",
    )
    preprocessing: TimeseriesOutputPreprocessing = Field(
        default_factory=lambda: TimeseriesOutputPreprocessing(), description="How the target's cells read as series."
    )
    loss: TimeseriesLoss = Field(default_factory=lambda: TimeseriesLoss(), description="timeseries: the loss.")


Output = TimeseriesOutput
METRICS: tuple[str, ...] = ("loss", "mse", "mae", "rmse", "r2")
WIDE = True
RANKS = False

check, block_summary, check_blocks = series_input.check, series_input.block_summary, series_input.check_blocks
target_summary, check_target_blocks = no_target_summary, no_target_check


def check_target(col: pd.Series, out: TimeseriesOutput, source: str) -> None:
    return None


def fit(col: pd.Series, out: TimeseriesOutput) -> dict[str, Any]:
    return {"length": out.horizon} if out.horizon is not None else series_input.fit(col, out)


def fit_ray(train: Any, outs: list[TimeseriesOutput]) -> dict[str, dict[str, Any]]:
    fixed = {out.name: {"length": out.horizon} for out in outs if out.horizon is not None}
    rest = [out for out in outs if out.horizon is None]
    return {**fixed, **(series_input.fit_ray(train, rest) if rest else {})}


def transform(col: pd.Series, out: TimeseriesOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's first ``length`` values (padded), and the rows that have a series."""
    p, length = out.preprocessing, int(meta["length"])
    values, bad = series_input.parse(col, p)
    if bad.any():  # a dataset to evaluate on
        raise series_input.not_series("output_features", out, *bad_cells(col, bad))
    array = series_input.padded([np.zeros(0) if v is None else v for v in values], length, p)
    return array, np.array([v is not None for v in values], dtype=bool)


def decoder_size(out: TimeseriesOutput, meta: dict[str, Any]) -> int:
    return int(meta["length"])


def loss(out: TimeseriesOutput) -> nn.Module:
    from torch import nn

    if out.loss.type == "huber":
        return nn.HuberLoss(delta=out.loss.delta)  # Ludwig's huber: torch's, a mean over every value
    return nn.MSELoss() if out.loss.type == "mean_squared_error" else nn.L1Loss()


def predictions(out: TimeseriesOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return raw, None


def _as_vector(out: TimeseriesOutput) -> Any:
    """``out`` for the vector output's sums and metrics, which read only the rows' values."""
    return out


def sum_names(out: TimeseriesOutput, meta: dict[str, Any]) -> list[str]:
    return vector.sum_names(_as_vector(out), {"size": meta["length"]})


def add_sums(sums: dict[str, float], out: TimeseriesOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    return vector.add_sums(sums, _as_vector(out), raw, target, {"size": meta["length"]})


def metrics(out: TimeseriesOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    """A vector's (mse, mae over every value, r2 the steps' mean) and rmse, the root of mse."""
    measured = vector.metrics(_as_vector(out), sums, scored, {"size": meta["length"]})
    return {**measured, "rmse": math.sqrt(measured["mse"])}


predicted = vector.predicted  # each kept row's values as a list

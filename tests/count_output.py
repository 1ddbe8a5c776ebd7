"""An output type that is not built in, for tests/declarative/test_output_types.py: a count (a
whole number from 0), learnt as a Poisson rate by its log, whose metric is the mean
absolute error of the expected count. It is what adding an output type takes: this one
module, and one entry in ``OUTPUTS`` (the test adds it with monkeypatch)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.declarative.features import number
from raylight.declarative.outputs.base import OutputModel


class CountOutput(OutputModel):
    type: Literal["count"]
    max_count: int = Field(1000, ge=1, le=10**6, description="Counts above this are taken as this.")


Output = CountOutput
METRICS: tuple[str, ...] = ("loss", "mae")
WIDE = False
RANKS = False

check, block_summary, check_blocks = number.check, number.block_summary, number.check_blocks  # a number column


def _negative(col: pd.Series) -> np.ndarray:
    values = pd.to_numeric(col, errors="coerce")
    return ((values < 0) | (values % 1 != 0)).to_numpy()


def check_target(col: pd.Series, out: CountOutput, source: str) -> None:
    if _negative(col).any():
        raise ConfigError(f"target column {out.col!r} (count) of dataset {source!r} holds values that are no counts")


def target_summary(col: pd.Series, out: CountOutput) -> dict[str, Any]:
    return {"bad": int(_negative(col).sum())}


def check_target_blocks(summary: pd.DataFrame, out: CountOutput, source: str) -> None:
    if summary["bad"].sum():
        raise ConfigError(f"target column {out.col!r} (count) of dataset {source!r} holds values that are no counts")


def fit(col: pd.Series, out: CountOutput) -> dict[str, Any]:
    return {"mean": float(pd.to_numeric(col, errors="coerce").mean())}


def fit_ray(train: Any, outs: list[CountOutput]) -> dict[str, dict[str, Any]]:
    df = train.to_pandas()
    return {out.name: fit(df[out.col], out) for out in outs}


def transform(col: pd.Series, out: CountOutput, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    values = pd.to_numeric(col, errors="coerce").clip(upper=out.max_count)
    return values.fillna(0).to_numpy(dtype=np.float32), values.notna().to_numpy()


def decoder_size(out: CountOutput, meta: dict[str, Any]) -> int:
    return 1


def loss(out: CountOutput) -> nn.Module:
    return nn.PoissonNLLLoss(log_input=True)


def predictions(out: CountOutput, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.exp(raw), None  # the expected count


def sum_names(out: CountOutput, meta: dict[str, Any]) -> list[str]:
    return ["sae"]


def add_sums(sums: dict[str, float], out: CountOutput, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]) -> None:
    sums["sae"] += float((torch.exp(raw) - target).abs().sum())
    return None


def metrics(out: CountOutput, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
    return {"mae": sums["sae"] / (sums["n"] or 1.0)}


def predicted(out: CountOutput, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    col = np.full(len(keep), np.nan)
    col[keep] = pred.numpy()
    return {f"{out.name}_predictions": col}

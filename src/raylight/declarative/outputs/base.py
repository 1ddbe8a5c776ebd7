"""What an output feature type provides (``OutputType``), and what the types share: the
fields every output has, the classifier targets' class checks, and the sums of an
evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Protocol

import numpy as np
import pandas as pd
from pydantic import Field

from raylight.base.exceptions import ConfigError
from raylight.declarative.features.base import FeatureModel
from raylight.declarative.layers import DecoderConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


# The binary and set outputs' shared setting: one definition, one description.
Threshold = Annotated[float, Field(
    gt=0, lt=1,
    description="binary, set: predict true (a label) at this probability and above (Ludwig's); accuracy and "
    "jaccard count those predictions, roc_auc does not depend on it.",
)]


class OutputModel(FeatureModel):
    """The fields of every output feature; a type's model narrows ``type`` to its name
    (``Literal["binary"]``) and adds its own settings."""

    loss_weight: float = Field(
        1.0, gt=0, le=1e6,
        description="Multiplies this output's loss in training (Ludwig's loss.weight); the reported losses are unweighted.",
    )
    decoder: DecoderConfig = Field(
        default_factory=lambda: DecoderConfig(),
        description="Ludwig's decoder layers: fully connected layers (fc_layers, or num_fc_layers of "
        "fc_output_size units) between the combiner and this output's linear layer; none by default.",
    )


# -- classifiers: a target of two classes or more ---------------------------------------
def check_classes(out: Any, classes: list[Any], source: str, *, most: int | None = None) -> None:
    """A classifier's target needs two classes (a binary one, ``most``, at most two)."""
    if len(classes) < 2:
        raise ConfigError(
            f"target column {out.col!r} ({out.type}) of dataset {source!r} has only one class "
            f"({classes}); a classifier needs at least two"
        )
    if most is not None and len(classes) > most:
        raise ConfigError(
            f"target column {out.col!r} is declared {out.type} but has {len(classes)} classes; "
            "declare it as category"
        )


def first_classes(col: pd.Series, out: Any) -> dict[str, Any]:
    """A block's first three distinct values, as strings: enough to tell one class from
    two and two from more (``target_summary`` of a classifier)."""
    return {"classes": [str(v) for v in col.dropna().unique()[:3]]}


def block_classes(summary: pd.DataFrame) -> list[str]:
    """The distinct values of the blocks' ``first_classes``, sorted."""
    return sorted({c for cs in summary["classes"] for c in cs})


def no_target_summary(col: pd.Series, out: Any) -> dict[str, Any]:
    return {}


def no_target_check(summary: Any, out: Any, source: str) -> None:
    return None


class OutputType(Protocol):
    """One output feature type. Each module of this package is one (modules satisfy a
    Protocol); ``OUTPUTS`` in ``__init__.py`` lists them. ``out`` is an output feature of
    the type (its ``Output``), ``meta`` what its ``fit`` learnt, ``raw`` its decoder's
    rows for a batch, ``kind`` ``output_features`` (for messages), ``source`` the
    dataset (for messages)."""

    METRICS: tuple[str, ...]  # what an evaluation measures of it on validation and test, loss first
    WIDE: bool  # its decoder's rows keep their width (a value per class, label or float); else one value each
    RANKS: bool  # its metrics need every row's (score, label): ``add_sums`` returns them, gathered from every process

    @property
    def Output(self) -> type[OutputModel]:
        """Its config model: an OutputModel with ``type: Literal["<name>"]``."""
        ...

    def check(self, col: pd.Series, out: Any, kind: str) -> None:
        """Raise a ConfigError naming the column if it cannot hold this type (pandas)."""
        ...

    def block_summary(self, col: pd.Series, out: Any) -> dict[str, Any]:
        """Ray Data: what ``check_blocks`` needs, from one block of the column."""
        ...

    def check_blocks(self, summary: pd.DataFrame, out: Any, kind: str) -> None:
        """Ray Data: ``check``, from the ``block_summary`` of each block (one row each)."""
        ...

    def check_target(self, col: pd.Series, out: Any, source: str) -> None:
        """Raise a ConfigError if the target's values cannot be learnt (a classifier's one class)."""
        ...

    def target_summary(self, col: pd.Series, out: Any) -> dict[str, Any]:
        """Ray Data: what ``check_target_blocks`` needs, from one block of the column."""
        ...

    def check_target_blocks(self, summary: pd.DataFrame, out: Any, source: str) -> None:
        """Ray Data: ``check_target``, from the ``target_summary`` of each block."""
        ...

    def fit(self, col: pd.Series, out: Any) -> dict[str, Any]:
        """What the transform and the decoder need (JSON-able), from the training split's column."""
        ...

    def fit_ray(self, train: Any, outs: list[Any]) -> dict[str, dict[str, Any]]:
        """``fit`` on a Ray Data split, for all outputs of the type at once, by name."""
        ...

    def transform(self, col: pd.Series, out: Any, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The target for each row, and the mask of rows kept (a row without a target is dropped)."""
        ...

    def decoder_size(self, out: Any, meta: dict[str, Any]) -> int:
        """The values its decoder (one linear layer after the combiner) gives per row."""
        ...

    # Optional, where a type's decoder is its own module in place of the linear layer (the
    # anomaly type's center distance): ``decoder(out, width) -> nn.Module``, reading the
    # combiner's ``width`` values. And where a type fits values after training (anomaly's
    # radius and threshold): ``after_training(out, train_scores, validation_scores) ->
    # dict``, merged into its ``meta`` before the model is saved (``train.finish_meta``).

    def loss(self, out: Any) -> nn.Module:
        """Its loss, of ``raw`` and the targets, a mean over the rows."""
        ...

    def predictions(self, out: Any, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Predicted values and, for classifiers, probabilities."""
        ...

    def sum_names(self, out: Any, meta: dict[str, Any]) -> list[str]:
        """The sums ``add_sums`` keeps, beside the rows (``n``) and the loss's (``loss``)."""
        ...

    def add_sums(
        self, sums: dict[str, float], out: Any, raw: torch.Tensor, target: torch.Tensor, meta: dict[str, Any]
    ) -> np.ndarray | None:
        """Add a chunk's sums; return its (score, label) rows where ``RANKS``, else None."""
        ...

    def metrics(self, out: Any, sums: dict[str, float], scored: np.ndarray | None, meta: dict[str, Any]) -> dict[str, float]:
        """Its ``METRICS`` (those it measures with this ``meta``) from the sums of every chunk, and
        (where ``RANKS``) every row's (score, label)."""
        ...

    def predicted(self, out: Any, pred: torch.Tensor, prob: torch.Tensor | None, meta: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
        """Its prediction columns: ``<name>_predictions`` and, for classifiers, probabilities;
        null in the rows ``keep`` leaves out."""
        ...

"""Ludwig's tabnet combiner (TabNet, Arik and Pfister 2019): the encoded inputs
concatenated and batch-normalised; ``num_steps`` decision steps, each an attentive
transformer choosing features (a sparse mask by sparsemax or entmax, scaled by how much
earlier steps used each feature, ``relaxation_factor``) and a feature transformer
(``num_total_blocks`` GLU blocks, the first ``num_shared_blocks`` shared by the steps,
ghost batch norm of ``bn_virtual_bs`` rows); the steps' ReLU outputs added up and
projected to ``output_size``, then dropout. The masks' entropy times ``sparsity`` is
added to the training loss (Ludwig's sparsity loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from raylight.declarative.combiners.base import CombinerModel, Encoded
from raylight.declarative.features.base import MAX_WIDTH

if TYPE_CHECKING:
    from torch import nn


class TabNetCombiner(CombinerModel):
    type: Literal["tabnet"] = Field(description="Ludwig's tabnet combiner.")
    size: int = Field(32, ge=1, le=MAX_WIDTH, description="Width of the attentive part of each step (N_a).")
    output_size: int = Field(128, ge=1, le=MAX_WIDTH, description="Width of the output of each step and of the combiner (N_d).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the combiner's output.")
    num_steps: int = Field(3, ge=1, le=64, description="Decision steps (N_steps).")
    num_total_blocks: int = Field(4, ge=1, le=64, description="GLU blocks in each feature transformer.")
    num_shared_blocks: int = Field(2, ge=0, le=64, description="Of those, the first ones shared by every step.")
    relaxation_factor: float = Field(1.5, ge=1, le=100, description="How often a feature may be chosen across the steps (gamma; 1: once).")
    bn_epsilon: float = Field(1e-3, gt=0, lt=1, description="Epsilon of the batch norms.")
    bn_momentum: float = Field(0.05, gt=0, le=1, description="Momentum of the batch norms (torch's: the new batch's share).")
    bn_virtual_bs: int | None = Field(1024, ge=1, description="Rows of each ghost batch norm's virtual batch; null: plain batch norm.")
    sparsity: float = Field(1e-4, ge=0, description="Weight of the masks' entropy in the loss (lambda_sparse).")
    entmax_mode: Literal["sparsemax", "entmax15", "constant", "adaptive"] = Field(
        "sparsemax", description="The masks' mapping: sparsemax, entmax15, entmax of entmax_alpha (constant), or of a learned alpha (adaptive)."
    )
    entmax_alpha: float = Field(1.5, ge=1, le=2, description="constant, adaptive: entmax's alpha (1: softmax, 2: sparsemax); adaptive's start.")

    @model_validator(mode="after")
    def _blocks(self) -> TabNetCombiner:
        if self.num_shared_blocks > self.num_total_blocks:
            raise ValueError(
                f"num_shared_blocks {self.num_shared_blocks} is more than num_total_blocks {self.num_total_blocks}: "
                "the shared blocks are the first of each feature transformer; lower it"
            )
        return self


Config = TabNetCombiner


def build(config: TabNetCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.tabnet import TabNetModule

    return TabNetModule(config, sum(e.size for e in inputs))

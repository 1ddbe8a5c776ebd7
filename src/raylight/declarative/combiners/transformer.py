"""Ludwig's transformer combiner: each encoded input (flattened) projected to
``hidden_size``, the inputs as the steps of a sequence through ``num_layers`` transformer
blocks (Ludwig's: post-norm, ReLU feed-forward of ``transformer_output_size``, layer-norm
epsilon 1e-6, no positions), reduced over the inputs (``reduce_output``, mean), then
fully connected layers (Ludwig's ``fc_*`` keys; none by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from raylight.declarative.combiners.base import (
    CombinerModel,
    Encoded,
    FCSettings,
    Reduce,
    ludwig_layers,
)
from raylight.declarative.features.base import MAX_WIDTH

if TYPE_CHECKING:
    from torch import nn


class TransformerSettings(CombinerModel, FCSettings):
    """Ludwig's CommonTransformerConfig: the transformer's settings and its layers'."""

    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout in the transformer blocks.")
    hidden_size: int = Field(256, ge=1, le=MAX_WIDTH, description="Width each input is projected to (a multiple of num_heads).")
    transformer_output_size: int = Field(256, ge=1, le=MAX_WIDTH, description="Width of each block's feed-forward layer.")
    num_layers: int = Field(1, ge=1, le=64, description="Transformer blocks.")
    num_heads: int = Field(8, ge=1, le=1024, description="Attention heads.")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_layers(cls, data: Any) -> Any:
        return ludwig_layers(data, count=0, size=256)

    @model_validator(mode="after")
    def _heads(self) -> TransformerSettings:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}: each head takes "
                "hidden_size / num_heads of the width; change one of them"
            )
        return self


class TransformerCombiner(TransformerSettings):
    type: Literal["transformer"] = Field(description="Ludwig's transformer combiner.")
    reduce_output: Reduce | None = Field(
        "mean", description="How the inputs' outputs reduce to one vector: sum, mean, max, concat, last; null: summed."
    )


Config = TransformerCombiner


def build(config: TransformerCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import TransformerModule

    return TransformerModule(config, inputs)

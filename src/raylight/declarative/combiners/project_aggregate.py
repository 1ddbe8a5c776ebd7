"""Ludwig's project_aggregate combiner: each encoded input (flattened) projected to
``projection_size``, the projections averaged, then fully connected layers (two of 128
units, layer norm, residual, by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from raylight.declarative.combiners.base import Encoded
from raylight.declarative.features.base import MAX_WIDTH
from raylight.declarative.layers import FCLayer, FCStackConfig, Norm

if TYPE_CHECKING:
    from torch import nn


class ProjectAggregateCombiner(FCStackConfig):
    LUDWIG_COUNT: ClassVar[int] = 2
    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 128

    type: Literal["project_aggregate"] = Field(description="Ludwig's project_aggregate combiner.")
    projection_size: int = Field(128, ge=1, le=MAX_WIDTH, description="Width each input is projected to.")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=128)] * 2, max_length=64, description="Layers after the average."
    )
    norm: Norm | None = Field("layer", description="batch or layer (default): normalise the layers' inputs and outputs; null: none.")
    residual: bool = Field(True, description="Add each layer's input to its output where their widths match.")


Config = ProjectAggregateCombiner


def build(config: ProjectAggregateCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import ProjectAggregateModule

    return ProjectAggregateModule(config, inputs)

"""Ludwig's hypernetwork combiner (HyperFusion): each encoded input (flattened) projected
to ``hidden_size``; the first input's projection, through a small network of
``hyper_hidden_size`` units (linear, ReLU, linear), gives a ``hidden_size`` x
``hidden_size`` matrix per row, which multiplies each other input's projection; the first
projection and the transformed others concatenated (``hidden_size`` x the inputs), then
fully connected layers (Ludwig's ``num_fc_layers`` x ``output_size``: none by default,
so the concatenation is the output). So the first input (in the config's order) decides
how the others are read: put the conditioning one (a sensor's type, a patient's group)
first."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from raylight.declarative.combiners.base import Encoded
from raylight.declarative.features.base import MAX_WIDTH
from raylight.declarative.layers import FCLayer, FCStackConfig

if TYPE_CHECKING:
    from torch import nn


class HyperNetworkCombiner(FCStackConfig):
    LUDWIG_COUNT: ClassVar[int] = 0
    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 128

    type: Literal["hypernetwork"] = Field(description="Ludwig's hypernetwork combiner.")
    hidden_size: int = Field(
        128, ge=1, le=1024,
        description="Width each input is projected to; the generated matrix is hidden_size x hidden_size per row.",
    )
    hyper_hidden_size: int = Field(64, ge=1, le=MAX_WIDTH, description="Units of the network that generates the matrix.")
    fc_layers: list[FCLayer] = Field(
        default_factory=list, max_length=64,
        description="Layers after the concatenation (Ludwig's num_fc_layers: 0, none: the concatenation is the output).",
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout after each of the layers (Ludwig's default 0.1).")


Config = HyperNetworkCombiner


def build(config: HyperNetworkCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import HyperNetworkModule

    return HyperNetworkModule(config, inputs)

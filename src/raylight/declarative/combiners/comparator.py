"""Ludwig's comparator combiner: two entities, each a list of inputs (``entity_1``,
``entity_2``), each concatenated and through its own fully connected layers (one of 256
units by default; the two stacks alike), then compared: their dot product, elementwise
product, absolute difference and a bilinear product (Ludwig's: a fixed random matrix),
concatenated (2 x the last layer's width + 2). With no layers (Ludwig's ``num_fc_layers:
0``) the entities' concatenated inputs are compared, as Ludwig's empty FCStack passes them
on: the two must then be as wide."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from raylight.declarative.combiners.base import Encoded
from raylight.declarative.layers import FCLayer, FCStackConfig

if TYPE_CHECKING:
    from torch import nn


class ComparatorCombiner(FCStackConfig):
    LUDWIG_COUNT: ClassVar[int] = 1
    LUDWIG_OUTPUT_SIZE: ClassVar[int] = 256

    type: Literal["comparator"] = Field(description="Ludwig's comparator combiner.")
    entity_1: list[str] = Field(min_length=1, description="The input features of the first entity (required).")
    entity_2: list[str] = Field(min_length=1, description="The input features of the second entity (required).")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=256)], max_length=64,
        description="Each entity's layers (none: the concatenated inputs, which must be as wide).",
    )

    def check_inputs(self, inputs: list[Any]) -> tuple[str | None, str] | None:
        names = [f.name for f in inputs]
        for key in ("entity_1", "entity_2"):
            unknown = [n for n in getattr(self, key) if n not in names]
            if unknown:
                return key, f"{unknown} are not input features; use names of {names}"
        left = [n for n in names if n not in self.entity_1 and n not in self.entity_2]
        if left:
            return None, f"inputs {left} are in neither entity_1 nor entity_2; add each to one of them"
        return None

Config = ComparatorCombiner


def build(config: ComparatorCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import ComparatorModule

    return ComparatorModule(config, inputs)

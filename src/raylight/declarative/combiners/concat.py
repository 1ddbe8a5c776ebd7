"""Ludwig's concat combiner (its default): the encoded inputs concatenated, then fully
connected layers (each: linear, normalisation, activation, dropout), in Ludwig's order.
A concat section naming no layers has one 64-unit layer (Ludwig's: none). A config with no
combiner section gets Ludwig 0.17's choice (``config.model.FT_TRANSFORMER_FROM_INPUTS``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from raylight.declarative.combiners.base import Encoded
from raylight.declarative.layers import FCLayer, FCStackConfig

if TYPE_CHECKING:
    from torch import nn


class ConcatCombiner(FCStackConfig):
    """Ludwig's concat combiner: the encoded inputs concatenated, then fully connected
    layers (each: linear, normalisation, activation, dropout), in Ludwig's order."""

    type: Literal["concat"] = Field("concat", description="How encoded inputs are combined.")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=64)], max_length=64, description="Layers after concatenation."
    )

    def check_inputs(self, inputs: list[Any]) -> tuple[str | None, str] | None:
        stepped = [f.name for f in inputs if getattr(getattr(f, "encoder", None), "reduce_output", "sum") is None]
        if not stepped:
            return None
        return "type", (
            f"concat concatenates one vector per input, and {stepped} give their outputs per step "
            "(encoder.reduce_output: null); give them a reduce_output (sum, mean, max, last) or use "
            "combiner type sequence_concat or sequence"
        )


Config = ConcatCombiner


def build(config: ConcatCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import ConcatModule

    return ConcatModule(config, sum(e.size for e in inputs))

"""Ludwig's sequence combiner: the steps as sequence_concat concatenates them (not
reduced), through a sequence encoder of its own (``encoder``, parallel_cnn by default,
over the concatenated steps as its channels: no embedding), then reduced
(``reduce_output``; null: summed, as Ludwig's outputs' default ``reduce_input``, and
the encoder's layers left out, as Ludwig's; otherwise the encoder's layers after it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from raylight.declarative.combiners.base import CombinerModel, Encoded
from raylight.declarative.combiners.sequence_concat import check_main
from raylight.declarative.features.sequence import SequenceEncoder

if TYPE_CHECKING:
    from torch import nn


class SequenceCombiner(CombinerModel):
    type: Literal["sequence"] = Field(description="Ludwig's sequence combiner.")
    main_sequence_feature: str | None = Field(
        None, description="The input whose steps the others are concatenated to; null: the first with an output per step."
    )
    encoder: SequenceEncoder = Field(
        default_factory=lambda: SequenceEncoder.model_validate({"type": "parallel_cnn"}),
        description="The sequence encoder over the concatenated steps: parallel_cnn (default), stacked_cnn, "
        "stacked_parallel_cnn, rnn, cnnrnn, transformer, with their settings (embedding_size is not used).",
    )
    reduce_output: Literal["sum", "mean", "avg", "max", "last"] | None = Field(
        None, description="How the encoder's steps reduce: sum, mean, max, last; null (Ludwig's default): summed, without the encoder's layers."
    )

    @field_validator("encoder")
    @classmethod
    def _not_embed(cls, value: SequenceEncoder) -> SequenceEncoder:
        if value.type == "embed":
            raise ValueError("type: embed gives one vector, not one per step; use parallel_cnn, stacked_cnn, rnn, transformer, ...")
        return value

    def check_inputs(self, inputs: list[Any]) -> tuple[str | None, str] | None:
        return check_main(self.main_sequence_feature, inputs)


Config = SequenceCombiner


def build(config: SequenceCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import SequenceModule

    return SequenceModule(config, inputs)

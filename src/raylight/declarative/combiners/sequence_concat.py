"""Ludwig's sequence_concat combiner: the outputs per step of a sequence, text or
timeseries input (one whose encoder has ``reduce_output: null``; ``main_sequence_feature``,
or the first such input), each other input's concatenated to every step (another
per-step input's step by step: its steps must be as many), the steps after the main
input's last non-zero one zeroed (Ludwig's mask), then reduced over the steps
(``reduce_output``; null: summed, as Ludwig's outputs' default ``reduce_input``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from raylight.declarative.combiners.base import CombinerModel, Encoded, Reduce

if TYPE_CHECKING:
    from torch import nn

_SEQUENCES = ("text", "sequence", "timeseries")


def stepped(inputs: list[Any]) -> list[str]:
    """The inputs whose encoders give an output per step (``reduce_output: null``)."""
    return [f.name for f in inputs if f.type in _SEQUENCES and getattr(f.encoder, "reduce_output", "sum") is None]


def check_main(main: str | None, inputs: list[Any]) -> tuple[str | None, str] | None:
    """Where a sequence combiner's inputs give it no steps to read: its key and the fix."""
    names, per_step = [f.name for f in inputs], stepped(inputs)
    if main is not None and main not in names:
        return "main_sequence_feature", f"{main!r} is not an input feature; use one of {per_step or names}"
    if main is not None and main not in per_step:
        return "main_sequence_feature", (
            f"{main!r} gives one vector; give its encoder reduce_output: null (a sequence, text or timeseries "
            "input with an encoder other than embed) for its output per step"
        )
    if not per_step:
        return None, (
            "a sequence combiner needs an input with an output per step: give a sequence, text or timeseries "
            "input an encoder other than embed (parallel_cnn, rnn, ...) with reduce_output: null"
        )
    return None

class SequenceConcatCombiner(CombinerModel):
    type: Literal["sequence_concat"] = Field(description="Ludwig's sequence_concat combiner.")
    main_sequence_feature: str | None = Field(
        None, description="The input whose steps the others are concatenated to; null: the first with an output per step."
    )
    reduce_output: Reduce | None = Field(
        None, description="How the steps reduce: sum, mean, max, concat, last; null (Ludwig's default): summed."
    )

    def check_inputs(self, inputs: list[Any]) -> tuple[str | None, str] | None:
        return check_main(self.main_sequence_feature, inputs)


Config = SequenceConcatCombiner


def build(config: SequenceConcatCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import SequenceConcatModule

    return SequenceConcatModule(config.main_sequence_feature, config.reduce_output, inputs)

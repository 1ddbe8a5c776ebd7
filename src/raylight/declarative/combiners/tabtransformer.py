"""Ludwig's tabtransformer combiner (TabTransformer, Huang et al. 2020): the inputs other
than numbers and binaries projected (``hidden_size``, less the width of a feature-name
embedding where ``embed_input_feature_name`` is a number), optionally given an
embedding of which input they are (``add``: added; a number: that many units
concatenated), through the transformer blocks and reduced (``reduce_output``: concat by
default); the numbers and binaries concatenated and layer-normalised beside them; then
the fully connected layers (``fc_*`` keys)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from raylight.declarative.combiners.base import Encoded, Reduce
from raylight.declarative.combiners.transformer import TransformerSettings

if TYPE_CHECKING:
    from torch import nn

# The types Ludwig's TabTransformer does not project (their values go beside the transformer).
UNEMBEDDED = frozenset({"number", "binary"})


class TabTransformerCombiner(TransformerSettings):
    type: Literal["tabtransformer"] = Field(description="Ludwig's tabtransformer combiner.")
    embed_input_feature_name: Literal["add"] | int | None = Field(
        None, description="Embed which input each step is: add (added to the projection), a number of units "
        "(concatenated to it, smaller than hidden_size), or null: none.",
    )
    reduce_output: Reduce | None = Field(
        "concat", description="How the transformer's outputs reduce: concat (default), sum, mean, max, last; null: summed."
    )

    @model_validator(mode="after")
    def _name_width(self) -> TabTransformerCombiner:
        e = self.embed_input_feature_name
        if isinstance(e, int) and not isinstance(e, bool) and not 0 < e < self.hidden_size:
            raise ValueError(
                f"embed_input_feature_name {e} must be a number of units from 1 to hidden_size - 1 "
                f"({self.hidden_size - 1}): the projection takes the rest; or add, or null"
            )
        return self


Config = TabTransformerCombiner


def build(config: TabTransformerCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import TabTransformerModule

    return TabTransformerModule(config, inputs)

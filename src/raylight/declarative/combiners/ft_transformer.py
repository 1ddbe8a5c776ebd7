"""Ludwig's ft_transformer combiner (FT-Transformer, Gorishniy et al. 2021): each encoded
input projected to a token of ``hidden_size``, a learned [CLS] token put before them, the
transformer blocks over them all, the [CLS] token's output, then the fully connected
layers (``fc_*`` keys; none by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from raylight.declarative.combiners.base import Encoded
from raylight.declarative.combiners.transformer import TransformerSettings

if TYPE_CHECKING:
    from torch import nn


class FTTransformerCombiner(TransformerSettings):
    type: Literal["ft_transformer"] = Field(description="Ludwig's ft_transformer combiner.")


Config = FTTransformerCombiner


def build(config: FTTransformerCombiner, inputs: list[Encoded]) -> nn.Module:
    from raylight.declarative.models.combiners import FTTransformerModule

    return FTTransformerModule(config, inputs)

"""Declarative combiner types (Ludwig's combiners): one module each, ``COMBINERS`` the family.

A type's module holds what ``CombinerType`` lists: its config model (Ludwig's keys and
defaults) and ``build``, which makes its torch module (in ``models/``) when a model is
built. The config's ``combiner`` section is the model of the type it names
(``CombinerSection``: concat where it names none, as Ludwig's). A new type is one module
and one entry.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, PlainValidator, SerializeAsAny, create_model

from raylight.config.base import ConfigModel
from raylight.declarative.combiners import (
    comparator,
    concat,
    ft_transformer,
    hypernetwork,
    project_aggregate,
    sequence,
    sequence_concat,
    tabnet,
    tabtransformer,
    transformer,
)
from raylight.declarative.combiners.base import CombinerModel, CombinerType, Encoded

# The order is that of the allowed types in the error for an unknown one.
COMBINERS: dict[str, CombinerType] = {
    "concat": concat, "transformer": transformer, "tabtransformer": tabtransformer, "ft_transformer": ft_transformer,
    "project_aggregate": project_aggregate, "tabnet": tabnet, "comparator": comparator,
    "sequence_concat": sequence_concat, "sequence": sequence, "hypernetwork": hypernetwork,
}


@functools.lru_cache(maxsize=8)
def _combiner_type(names: tuple[str, ...]) -> type[BaseModel]:
    """A model of a combiner's ``type`` alone, one of ``names``: pydantic's error for an
    unknown type, at ``combiner.type``."""
    kind = Literal[names]  # type: ignore[valid-type]  # built at run time
    return create_model("CombinerType", type=(kind, Field("concat", description="The combiner type.")))


def _combiner(value: Any) -> ConfigModel:
    """``value`` as the model of the combiner type it names (concat where it names none),
    one of COMBINERS as they are now. Errors keep the section's key paths
    (``combiner.hidden_size``)."""
    if isinstance(value, CombinerModel | concat.Config):
        return value
    if not isinstance(value, dict):
        return concat.Config.model_validate(value)  # pydantic's error for a value that is no mapping
    kind: str = _combiner_type(tuple(COMBINERS)).model_validate({k: v for k, v in value.items() if k == "type"}).model_dump()["type"]
    validated: ConfigModel = COMBINERS[kind].Config.model_validate(value)
    return validated


# Serialised as the type's model.
CombinerSection = Annotated[SerializeAsAny[CombinerModel | concat.Config], PlainValidator(_combiner)]

__all__ = ["COMBINERS", "CombinerModel", "CombinerSection", "CombinerType", "Encoded"]

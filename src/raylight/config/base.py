"""The base of every config model, the core's and the declarative product's alike."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo


class ConfigModel(BaseModel):
    """Frozen, unknown keys are errors (naming the full key path), defaults validated too.
    A section written as null (``trainer: null``, ``encoder: null``; Ludwig renders
    ``backend: null``) is that section's defaults."""

    # NaN and infinity are never a valid setting: every float must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not any(value is None for value in data.values()):
            return data
        fields = {**{f.alias: f for f in cls.model_fields.values() if f.alias}, **cls.model_fields}
        return {k: v for k, v in data.items() if not (v is None and k in fields and _defaulted_section(fields[k]))}


def _defaulted_section(field: FieldInfo) -> bool:
    """Whether ``field`` holds a section (a config model, or a union of them) that has a
    default and does not take None itself (where None means something, it stays)."""
    if field.is_required():
        return False
    annotation = field.annotation
    options = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return all(isinstance(o, type) and issubclass(o, BaseModel) for o in options)

"""Did-you-mean for a declarative config's errors: an unknown key, or a value outside a
setting's choices (an enum, a feature type), gets the closest spelling the config takes
there (``difflib.get_close_matches``), beside the key path the error names already."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from raylight.base.exceptions import ConfigError
from raylight.config.validation import format_validation_error
from raylight.declarative.combiners import COMBINERS, CombinerModel
from raylight.declarative.combiners.concat import ConcatCombiner
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.features import FEATURES
from raylight.declarative.features.base import FeatureModel
from raylight.declarative.outputs import OUTPUTS, OutputModel

_QUOTED = re.compile(r"'([^']*)'")


def validate_config(data: Any, *, prefix: str = "") -> ModelConfig:
    """``data`` as a ModelConfig, or a ConfigError naming each bad key (as
    ``raylight.config.validation.validate``'s) with, where one is close, the spelling meant."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as err:
        lines = format_validation_error(err, prefix=prefix).split("\n")
        for i, hint in enumerate(hints(err, data)):
            if hint is not None:
                lines[i + 1] += f"; did you mean {hint!r}?"
        raise ConfigError("\n".join(lines)) from None


def hints(err: ValidationError, data: Any) -> list[str | None]:
    """For each of ``err``'s errors, in order, the closest spelling of what the config
    takes there, or None."""
    out: list[str | None] = []
    for item in err.errors():
        kind, ctx = item["type"], item.get("ctx") or {}
        word, choices = None, []
        if kind == "extra_forbidden":
            word, choices = str(item["loc"][-1]), keys_at(item["loc"][:-1], data)
        elif kind == "literal_error":
            word, choices = str(item.get("input")), _QUOTED.findall(str(ctx.get("expected", "")))
        elif kind == "union_tag_invalid":
            word, choices = str(ctx.get("tag")), _QUOTED.findall(str(ctx.get("expected_tags", "")))
        close = difflib.get_close_matches(word, choices, n=1) if word is not None else []
        out.append(close[0] if close and close[0] != word else None)
    return out


def keys_at(loc: tuple[Any, ...], data: Any) -> list[str]:
    """The keys the section at ``loc`` (a pydantic error's location, its feature tags
    included) takes; [] where that cannot be told (not a section, a union of sections)."""
    ann: Any = ModelConfig
    node = data
    for part in loc:
        ann = _section(ann, node)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if ann is FeatureModel and part in FEATURES:  # an input's tag: its type's model, same data
                ann = FEATURES[str(part)].Input
                continue
            field = ann.model_fields.get(str(part))
            if field is None:
                return []
            ann, node = field.annotation, node.get(part) if isinstance(node, dict) else None
        elif typing.get_origin(ann) is list and isinstance(part, int):
            (ann,) = typing.get_args(ann) or (None,)
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            return []
    ann = _section(ann, node)
    if ann is FeatureModel:  # the input's tag is not in the location: its type unknown
        return []
    return list(ann.model_fields) if isinstance(ann, type) and issubclass(ann, BaseModel) else []


def _section(ann: Any, node: Any) -> Any:
    """``ann`` without Annotated and None, its one model where it is a union with one;
    an output feature as its type's model (by the type the data names)."""
    while True:
        if typing.get_origin(ann) is typing.Annotated:
            ann = typing.get_args(ann)[0]
            continue
        args = typing.get_args(ann)
        if args and typing.get_origin(ann) not in (list, dict, typing.Literal):
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            lists = [a for a in args if typing.get_origin(a) is list]
            if len(models) + len(lists) == 1:
                ann = (models or lists)[0]
                continue
        break
    if ann is OutputModel and isinstance(node, dict) and node.get("type") in OUTPUTS:
        return OUTPUTS[node["type"]].Output
    if ann is FeatureModel and isinstance(node, dict) and node.get("type") in FEATURES:  # key paths without the tag
        return FEATURES[node["type"]].Input
    if set(typing.get_args(ann)) == {CombinerModel, ConcatCombiner}:  # the combiner: its type's model
        kind = node.get("type", "concat") if isinstance(node, dict) else None
        return COMBINERS[kind].Config if kind in COMBINERS else ann
    return ann

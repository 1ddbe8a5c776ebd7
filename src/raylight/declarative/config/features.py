"""The features' sections of the declarative config: each input feature as the model of
its type (``raylight.declarative.features``), and each output feature as the model of its
type (``raylight.declarative.outputs``).
"""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    PlainValidator,
    SerializeAsAny,
    TypeAdapter,
    ValidationError,
    create_model,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from raylight.declarative.features import FEATURES
from raylight.declarative.features.base import FeatureModel
from raylight.declarative.ludwig.errors import details
from raylight.declarative.outputs import OUTPUTS, OutputModel


# -- features ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _feature_union(models: tuple[type[FeatureModel], ...]) -> TypeAdapter[Any]:
    union = functools.reduce(operator.or_, models)  # a union built at run time: no static type
    return TypeAdapter(Annotated[union, Field(discriminator="type")])  # type: ignore[arg-type]


def _input_feature(value: Any) -> FeatureModel:
    """``value`` as the model of the type it names, one of FEATURES as they are now (so a
    type added to FEATURES is accepted). Errors keep pydantic's tagged-union key paths
    (``input_features.0.number.name``; ``ModelConfig`` reports them without the tag) and list the types in FEATURES' order."""
    validated: FeatureModel = _feature_union(tuple(f.Input for f in FEATURES.values())).validate_python(value)
    return validated


# Serialised as the type's model, not as the FeatureModel base.
InputFeature = Annotated[SerializeAsAny[FeatureModel], PlainValidator(_input_feature)]


@functools.lru_cache(maxsize=8)
def _output_type(names: tuple[str, ...]) -> type[BaseModel]:
    """A model of an output's ``type`` alone, one of ``names``: pydantic's error for a
    missing or unknown type, at ``output_features.<i>.type``."""
    kind = Literal[names]  # type: ignore[valid-type]  # built at run time
    return create_model("OutputType", type=(kind, Field(description="Target type; sets loss and metrics.")))


def _output_feature(value: Any) -> OutputModel:
    """``value`` as the model of the output type it names, one of OUTPUTS as they are now
    (so a type added to OUTPUTS is accepted). Errors keep the key paths of the output
    (``output_features.0.loss_weight``). A setting of another output type is dropped at
    its default (a config rendered before the types had models of their own loads) and an
    error otherwise, reported with the output's other errors."""
    if isinstance(value, OutputModel):
        return value
    if not isinstance(value, dict):
        return OutputModel.model_validate(value)  # pydantic's error for a value that is no mapping
    _output_type(tuple(OUTPUTS)).model_validate({k: v for k, v in value.items() if k == "type"})
    kind = value["type"]
    model = OUTPUTS[kind].Output
    mine = dict(value)
    problems: list[InitErrorDetails] = []
    for key in value:
        owners = [t for t, o in OUTPUTS.items() if t != kind and key in o.Output.model_fields and key not in model.model_fields]
        if not owners:
            continue
        if value[key] != OUTPUTS[owners[0]].Output.model_fields[key].default:
            message = f"a {' or '.join(owners)} output's setting; a {kind} output has none; remove it"
            problems.append(InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(key,), input=value[key]))
        del mine[key]
    if not problems:
        return model.model_validate(mine)
    try:  # the output's other problems beside these, at once
        model.model_validate(mine)
    except ValidationError as err:
        problems += [details(item, tuple(item["loc"])) for item in err.errors()]
    raise ValidationError.from_exception_data(model.__name__, problems)


# Serialised as the type's model, not as the OutputModel base.
OutputFeature = Annotated[SerializeAsAny[OutputModel], PlainValidator(_output_feature)]

"""The features' sections of the declarative config: each input feature as the model of
its type (``raylight.declarative.features``), and the output features.
"""

from __future__ import annotations

import functools
import operator
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    PlainValidator,
    SerializeAsAny,
    TypeAdapter,
    model_validator,
)

from raylight.declarative.features import FEATURES
from raylight.declarative.features.base import MAX_WIDTH, FeatureModel


# -- features ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _feature_union(models: tuple[type[FeatureModel], ...]) -> TypeAdapter[Any]:
    union = functools.reduce(operator.or_, models)  # a union built at run time: no static type
    return TypeAdapter(Annotated[union, Field(discriminator="type")])  # type: ignore[arg-type]


def _input_feature(value: Any) -> FeatureModel:
    """``value`` as the model of the type it names, one of FEATURES as they are now (so a
    type added to FEATURES is accepted). Errors keep pydantic's tagged-union key paths
    (``input_features.0.number.name``) and list the types in FEATURES' order."""
    validated: FeatureModel = _feature_union(tuple(f.Input for f in FEATURES.values())).validate_python(value)
    return validated


# Serialised as the type's model, not as the FeatureModel base.
InputFeature = Annotated[SerializeAsAny[FeatureModel], PlainValidator(_input_feature)]


OutputType = Literal["binary", "category", "number", "set", "vector"]
OUTPUT_TYPES: tuple[str, ...] = get_args(OutputType)


class OutputFeature(FeatureModel):
    type: OutputType = Field(description="Target type; sets loss and metrics.")
    loss_weight: float = Field(
        1.0, gt=0, le=1e6,
        description="Multiplies this output's loss in training (Ludwig's loss.weight); the reported losses are unweighted.",
    )
    threshold: float = Field(
        0.5, gt=0, lt=1,
        description="binary, set: predict true (a label) at this probability and above (Ludwig's); accuracy and "
        "jaccard count those predictions, roc_auc does not depend on it.",
    )

    vector_size: int | None = Field(
        None, ge=1, le=MAX_WIDTH,
        description="vector: the floats in each row (Ludwig's); null: the length the training rows share.",
    )
    top_k: int = Field(
        3, ge=1, le=MAX_WIDTH,
        description="category: hits_at_k counts a row right when its class is among the k most likely (Ludwig's).",
    )

    @model_validator(mode="after")
    def _threshold_of_a_classifier(self) -> OutputFeature:
        if self.threshold != 0.5 and self.type not in ("binary", "set"):
            raise ValueError(f"threshold: a binary or set output's setting; a {self.type} output has none; remove it")
        if self.vector_size is not None and self.type != "vector":
            raise ValueError(f"vector_size: a vector output's setting; a {self.type} output has none; remove it")
        if self.top_k != 3 and self.type != "category":
            raise ValueError(f"top_k: a category output's setting; a {self.type} output has none; remove it")
        return self

"""Configuration: pure data, validated by pydantic. Imports nothing else of raylight."""

from raylight.config.schema import (
    FSDP,
    AdaptiveConfig,
    DeepSpeed,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
)
from raylight.config.validation import format_validation_error, validate

__all__ = [
    "FSDP",
    "AdaptiveConfig",
    "DeepSpeed",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "TrainerConfig",
    "format_validation_error",
    "validate",
]

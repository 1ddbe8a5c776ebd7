"""Configuration: pure data, validated by pydantic. Imports nothing else of raylight."""

from raylight.config.loggers import MLflow, TensorBoard, Wandb
from raylight.config.schema import (
    DDP,
    FSDP,
    AdaptiveConfig,
    DeepSpeed,
    FailureConfig,
    Horovod,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
)
from raylight.config.validation import format_validation_error, validate

__all__ = [
    "DDP",
    "FSDP",
    "AdaptiveConfig",
    "DeepSpeed",
    "FailureConfig",
    "Horovod",
    "MLflow",
    "RunConfig",
    "ScalingConfig",
    "TensorBoard",
    "TrainerConfig",
    "Wandb",
    "format_validation_error",
    "validate",
]

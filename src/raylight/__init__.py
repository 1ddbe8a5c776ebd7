"""raylight: simple, efficient, adaptive data-parallel PyTorch training on Ray."""

from raylight.checkpoint import Checkpoint
from raylight.config import (
    AdaptiveConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
)
from raylight.context import TrainContext
from raylight.exceptions import (
    ClusterConnectionError,
    ConfigError,
    InsufficientResourcesError,
    RaylightError,
    RunInUseError,
    TrainingDivergedError,
    TrainingFailedError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerStartError,
)
from raylight.trainer import Result, Trainer, fit


def load_model(path: str):
    """Load a model trained by `raylight train` (``<output-directory>/model``); predicts
    with ``.predict(df)`` in plain Python, no Ray. Needs the declarative extra."""
    from raylight.declarative.train import load_model as _load

    return _load(path)

__version__ = "0.1.0"

__all__ = [
    "AdaptiveConfig",
    "Checkpoint",
    "ClusterConnectionError",
    "ConfigError",
    "FailureConfig",
    "InsufficientResourcesError",
    "RaylightError",
    "Result",
    "RunConfig",
    "RunInUseError",
    "ScalingConfig",
    "TrainContext",
    "Trainer",
    "TrainerConfig",
    "TrainingDivergedError",
    "TrainingFailedError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHangError",
    "WorkerStartError",
    "__version__",
    "fit",
    "load_model",
]

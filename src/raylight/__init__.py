"""raylight: simple, efficient, adaptive data-parallel PyTorch training on Ray."""

from typing import TYPE_CHECKING, Any

from raylight.base.exceptions import (
    ClusterConnectionError,
    ConfigError,
    InsufficientResourcesError,
    PreemptedError,
    RaylightError,
    RunInUseError,
    TrainingDivergedError,
    TrainingFailedError,
    WorkerDiedError,
    WorkerError,
    WorkerHangError,
    WorkerImportError,
    WorkerStartError,
)
from raylight.config import (
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
from raylight.storage.checkpoint import Checkpoint

if TYPE_CHECKING:
    from raylight.driver.trainer import Result, Trainer, fit, prestart_workers
    from raylight.worker.context import TrainContext
    from raylight.worker.run_channel import run_context

# torch and the engine load on first use, so that `import raylight` (and the CLI's
# start-up, and its error messages) does not pay seconds for them.
_LAZY = {
    "TrainContext": "raylight.worker.context", "Result": "raylight.driver.trainer", "Trainer": "raylight.driver.trainer", "fit": "raylight.driver.trainer",
    "prestart_workers": "raylight.driver.trainer",
    "run_context": "raylight.worker.run_channel",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raylight' has no attribute {name!r}")


def load_model(path: str):
    """Load a model trained by `raylight train` (``<output-directory>/model``); predicts
    with ``.predict(df)`` in plain Python, no Ray. Needs the declarative extra."""
    from raylight.declarative.train import load_model as _load

    return _load(path)


def release_workers() -> int:
    """Kill the idle worker processes this driver keeps for its next run now, rather than
    after ``ScalingConfig.idle_worker_timeout_s`` or at exit (``reuse_workers``). Returns
    how many were killed."""
    from raylight.worker_group.pool import release_workers as _release

    return _release()

__version__ = "0.1.0"

__all__ = [
    "DDP",
    "FSDP",
    "AdaptiveConfig",
    "Checkpoint",
    "ClusterConnectionError",
    "ConfigError",
    "DeepSpeed",
    "FailureConfig",
    "Horovod",
    "InsufficientResourcesError",
    "PreemptedError",
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
    "WorkerImportError",
    "WorkerStartError",
    "__version__",
    "fit",
    "load_model",
    "prestart_workers",
    "release_workers",
    "run_context",
]

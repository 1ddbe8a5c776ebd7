"""The settings of a training run: ``TrainerConfig`` and its sections, one module each
(``scaling``, ``strategies`` and ``deepspeed``, ``adaptive``, ``run``, ``failure``), all
importable from here. One home per setting; every field documented.

Models are frozen and forbid unknown keys, so a typo is an error naming the full key
path rather than a silently ignored setting.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from raylight.config.adaptive import LR_RULES, AdaptiveConfig, LRRule
from raylight.config.base import ConfigModel
from raylight.config.deepspeed import (
    DEEPSPEED_BATCH_KEYS,
    ZERO_SIZES,
    DeepSpeed,
    check_deepspeed_json,
)
from raylight.config.failure import CONNECT_TIMEOUT_S, FailureConfig
from raylight.config.run import LEASE_TIMEOUT_S, RunConfig
from raylight.config.scaling import (
    MAX_RESOURCE,
    MAX_WORKERS,
    WORKER_CPUS,
    WORKER_GPUS,
    Placement,
    ScalingConfig,
    check_resources,
    default_worker_resources,
)
from raylight.config.strategies import (
    DDP,
    FSDP,
    HOROVOD_IMPLEMENTATIONS,
    STRATEGIES,
    Horovod,
    HorovodImplementation,
    StrategyName,
    StrategySetting,
    check_strategy_name,
)

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DDP",
    "DEEPSPEED_BATCH_KEYS",
    "FSDP",
    "HOROVOD_IMPLEMENTATIONS",
    "LEASE_TIMEOUT_S",
    "LR_RULES",
    "MAX_RESOURCE",
    "MAX_WORKERS",
    "STRATEGIES",
    "WORKER_CPUS",
    "WORKER_GPUS",
    "ZERO_SIZES",
    "AdaptiveConfig",
    "DeepSpeed",
    "FailureConfig",
    "Horovod",
    "HorovodImplementation",
    "LRRule",
    "Placement",
    "RunConfig",
    "ScalingConfig",
    "StrategyName",
    "StrategySetting",
    "TrainerConfig",
    "check_deepspeed_json",
    "check_resources",
    "check_strategy_name",
    "default_worker_resources",
]

class TrainerConfig(ConfigModel):
    """Everything a `Trainer` needs besides the loop and its own config dict."""

    scaling: ScalingConfig = Field(
        default_factory=lambda: ScalingConfig(), description="Workers and their resources."
    )
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(), description="Run name, storage, reporting."
    )
    failure: FailureConfig = Field(
        default_factory=lambda: FailureConfig(), description="Fault tolerance and timeouts."
    )
    adaptive: AdaptiveConfig | None = Field(
        None, description="Adaptive batch size and learning rate; None keeps them fixed."
    )
    address: str | None = Field(
        None,
        description="Ray cluster to use: 'auto', 'ray://host:port' or host:port. Default: "
        "RAY_ADDRESS if set, else an embedded local Ray started once per process.",
    )

    @model_validator(mode="after")
    def _check_strategy(self) -> TrainerConfig:
        spec = self.scaling.strategy
        if self.scaling.strategy_name == "horovod" and self.adaptive is not None:
            raise ValueError(
                "scaling.strategy 'horovod' cannot run adaptive training (adaptive=...): "
                "hvd.DistributedOptimizer reduces the gradients itself, while adaptive training "
                "measures and reduces them in its own optimizer; remove adaptive, or use strategy 'ddp'"
            )
        if isinstance(spec, DeepSpeed) and self.adaptive is not None:
            fixed = {k: v for k, v in spec.config_dict.items() if k in DEEPSPEED_BATCH_KEYS and v != "auto"}
            if fixed:
                raise ValueError(
                    f"scaling.strategy deepspeed config gives {fixed}, but adaptive=... chooses "
                    "the batch size and accumulation as it trains: set them to 'auto' or remove them"
                )
        return self

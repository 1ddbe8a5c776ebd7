"""The ``backend:`` section of the declarative config: where a run preprocesses and
trains (processor, strategy, workers, failures).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from raylight.config.base import ConfigModel
from raylight.config.schema import (
    MAX_WORKERS,
    StrategySetting,
    check_resources,
)
from raylight.declarative.ludwig.spellings import strategy_from_ludwig


class ProcessorConfig(ConfigModel):
    type: Literal["auto", "pandas", "ray_data", "dask"] = Field(
        "auto",
        description="Where the ray backend preprocesses. auto: in the driver with pandas (as the "
        "local backend does) when the dataset's estimated in-memory size is at most "
        "in_memory_limit_mb, else on Ray Data; pandas or ray_data: always there; dask "
        "(Ludwig's name): ray_data. The local backend always uses pandas.",
    )
    in_memory_limit_mb: int | Literal["auto"] = Field(
        "auto",
        description="type auto: the largest estimated in-memory size (MB) of a dataset preprocessed "
        "in the driver; auto: a quarter of the memory available when the run starts.",
    )

    @field_validator("in_memory_limit_mb")
    @classmethod
    def _check_limit(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= 2**40:
            raise ValueError(f"must be between 0 and {2**40} MB or 'auto', got {value}")
        return value


# Restarts a declarative run allows by default: a worker lost to a flaky node or an OOM
# kill costs an epoch, not the run (the core's fit() keeps 0: a loop of one's own says).
DEFAULT_MAX_FAILURES = 3


class BackendTrainer(ConfigModel):
    strategy: StrategySetting = Field(
        "ddp",
        description="ddp: every worker holds the model; fsdp: sharded (PyTorch FSDP2); "
        "deepspeed: ZeRO stage 1 or 2 (extra deepspeed); horovod: Horovod's "
        "DistributedOptimizer (real Horovod where installed, else raylight.horovod; not with "
        "batch_size: auto, which trains adaptively). Or a mapping naming the strategy "
        "with `type:` (Ludwig's spelling) or `name:`, and its options, e.g. {type: fsdp, "
        "reshard_after_forward: false}, {type: ddp, shared_memory: false} or Ludwig's "
        "{type: deepspeed, zero_optimization: {stage: 2}}.",
    )
    num_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Workers; default: what the cluster's CPUs (or GPUs) allow.")
    use_gpu: bool = Field(False, description="One GPU per worker.")
    resources_per_worker: dict[str, float] | None = Field(None, description="Ray resources per worker.")
    min_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Elastic: fewest workers.")
    max_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Elastic: most workers.")
    max_failures: int = Field(
        DEFAULT_MAX_FAILURES,
        ge=0,
        le=1000,
        description="Restarts from the last checkpoint (the last epoch's) after a worker dies or "
        "raises (the core's FailureConfig.max_failures); 0: the first failure ends the run. The "
        "same error twice before any epoch ends is not retried.",
    )

    @field_validator("max_failures", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:  # 2.5 or "3" would be coerced
            raise ValueError(
                f"must be a whole number >= 0 (restarts from the last checkpoint after a worker fails; "
                f"0: none), got {value!r}"
            )
        return value

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return check_resources(value)

    @field_validator("strategy", mode="before")
    @classmethod
    def _ludwig_spelling(cls, value: Any) -> Any:
        return strategy_from_ludwig(value)

    @model_validator(mode="after")
    def _check_bounds(self) -> BackendTrainer:
        lo, hi = self.min_workers, self.max_workers
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_workers ({lo}) must not exceed max_workers ({hi})")
        return self


class BackendConfig(ConfigModel):
    type: Literal["local", "ray", "launcher", "horovod", "deepspeed"] | None = Field(
        None,
        description="local: one process; ray: workers on Ray; launcher (Ludwig's horovod and "
        "deepspeed name it too): the processes torchrun, horovodrun, mpirun or the deepspeed "
        "launcher started, which it requires. Unset: ray if a cluster is reachable, else local. "
        "Whatever it says, a process such a launcher started joins the launcher's group.",
    )
    processor: ProcessorConfig = Field(default_factory=lambda: ProcessorConfig(), description="Preprocessing engine.")
    trainer: BackendTrainer = Field(default_factory=lambda: BackendTrainer(), description="Distributed training.")
    cache_dir: str | None = Field(None, description="fsspec URI caching preprocessed data by config + data fingerprint.")

"""The settings of a training run. One home per setting; every field documented.

Models are frozen and forbid unknown keys, so a typo is an error naming the full key
path rather than a silently ignored setting.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ScalingConfig(_Model):
    """How many workers, with which resources, placed how."""

    num_workers: int = Field(
        1,
        ge=0,
        description="Number of data-parallel worker processes. 0 runs the loop in this "
        "process without Ray, for debugging.",
    )
    use_gpu: bool = Field(False, description="Give each worker one GPU and use NCCL.")
    resources_per_worker: dict[str, float] | None = Field(
        None,
        description="Ray resources per worker, e.g. {'CPU': 2}. Default: 1 CPU, plus 1 GPU "
        "when use_gpu.",
    )
    placement: Placement = Field(
        "PACK", description="Placement-group strategy for the workers' bundles."
    )
    threads_per_worker: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads in each worker. Default: the worker's CPU count.",
    )
    strategy: Literal["ddp"] = Field("ddp", description="Data-parallel strategy.")

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        for key, amount in value.items():
            if amount < 0:
                raise ValueError(f"resource {key!r} must be >= 0, got {amount}")
        if value.get("CPU", 1) == 0 and value.get("GPU", 0) == 0:
            raise ValueError("a worker needs at least some CPU or GPU, got CPU: 0")
        return value

    @model_validator(mode="after")
    def _check_gpu(self) -> ScalingConfig:
        res = self.resources_per_worker or {}
        if res.get("GPU", 0) > 0 and not self.use_gpu:
            raise ValueError(
                "resources_per_worker asks for GPUs but use_gpu is false; set use_gpu=True"
            )
        return self

    def worker_resources(self) -> dict[str, float]:
        """Resources of one worker's bundle, defaults filled in."""
        res = dict(self.resources_per_worker or {})
        res.setdefault("CPU", 1.0)
        if self.use_gpu:
            res.setdefault("GPU", 1.0)
        return {k: float(v) for k, v in res.items() if v > 0}

    def worker_threads(self) -> int:
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return max(1, int(self.worker_resources().get("CPU", 1)))


class RunConfig(_Model):
    """Where a run lives and how it reports."""

    name: str | None = Field(
        None,
        description="Run name; the run directory is <storage_path>/<name>. Default: "
        "'run-<timestamp>'. Needed to resume a run.",
    )
    storage_path: str | None = Field(
        None,
        description="Local directory or fsspec URI (s3://, gs://, memory://) for run "
        "directories. Default: ~/raylight_results.",
    )
    checkpoints_to_keep: int = Field(
        2, ge=1, description="Committed checkpoints kept; older ones are deleted."
    )
    resume: bool = Field(
        False,
        description="Continue the run named `name` from its last committed checkpoint.",
    )
    progress: bool = Field(True, description="Show the live progress display on the driver.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or value in {".", ".."}):
            raise ValueError(f"must be a non-empty name without '/', got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_resume(self) -> RunConfig:
        if self.resume and self.name is None:
            raise ValueError("resume=True needs the name of the run to resume; set name")
        return self


class FailureConfig(_Model):
    """Fault tolerance, and the timeout of every wait on a remote thing."""

    max_failures: int = Field(
        0,
        ge=-1,
        description="Restarts allowed after worker failures; -1 for unlimited.",
    )
    hang_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A worker that reports no progress (no batch, report or collective) "
        "for this long is declared hung.",
    )
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="A worker that does not answer a health poll in this long is hung."
    )
    poll_interval_s: float = Field(
        0.2, gt=0, description="How often the driver polls workers for status."
    )
    connect_timeout_s: float = Field(
        15.0, gt=0, description="How long to try reaching a Ray cluster given by address."
    )
    placement_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long to wait for the cluster to place all workers before failing.",
    )
    worker_start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long workers may take to start and join the process group.",
    )
    collective_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="torch.distributed timeout for one collective; the driver's hang "
        "detection usually acts first.",
    )


class TrainerConfig(_Model):
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
    address: str | None = Field(
        None,
        description="Ray cluster to use: 'auto', 'ray://host:port' or host:port. Default: "
        "RAY_ADDRESS if set, else an embedded local Ray started once per process.",
    )

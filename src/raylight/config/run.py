"""The ``run`` section: where a run lives and how it reports."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from raylight.config.base import ConfigModel
from raylight.config.loggers import LoggerSetting, parse_loggers

LEASE_TIMEOUT_S = 60.0  # RunConfig.lease_timeout_s's default (and the run recorder's)


class RunConfig(ConfigModel):
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
    loggers: list[LoggerSetting] = Field(
        default_factory=list,
        description="Experiment loggers the driver writes each report to: 'tensorboard', "
        "'mlflow', 'wandb', or their options ({'type': 'mlflow', 'tracking_uri': ...}, "
        "raylight.config.MLflow(...)). Needs `pip install 'raylight[loggers]'`.",
    )
    verbose: bool | None = Field(
        None,
        description="Show Ray's own output on the driver too (Ray Data's progress and INFO "
        "lines, Ray's INFO logs). Default: the RAYLIGHT_VERBOSE environment variable (which "
        "`raylight --verbose` sets), else off: raylight's display, warnings and errors only.",
    )
    lease_timeout_s: float = Field(
        LEASE_TIMEOUT_S,
        gt=0,
        le=86_400,
        description="Run directories on object stores: a driver holding a run (its lease) "
        "that has not renewed it for this long is taken to be gone, and another driver may "
        "take the run over. On a local disk a dead driver's lease ends at once.",
    )

    prices: dict[str, float] | None = Field(
        None,
        description="USD per hour of each node type the run's workers use (the autoscaler's "
        "node type, 'head', or a node's shape such as 'CPU:8'); '*' prices every type not "
        "named. Result.cost then says what the run cost (node-hours x price). Default: the "
        "RAYLIGHT_PRICES environment variable (set by `raylight submit --price`), else none.",
    )

    _parse_loggers = field_validator("loggers", mode="before")(parse_loggers)

    @field_validator("prices")
    @classmethod
    def _check_prices(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for node_type, price in (value or {}).items():
            if not node_type.strip():
                raise ValueError("a node type must be a non-empty string, e.g. {'m5.xlarge': 0.192}")
            if price < 0:
                raise ValueError(f"the price of {node_type!r} must be >= 0 USD per hour, got {price:g}")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and (
            not value or "/" in value or "\\" in value or value in {".", ".."}
            or any(ord(c) < 32 for c in value) or len(value.encode()) > 255
        ):
            raise ValueError(
                f"must be a plain directory name (no '/', '\\' or control characters, at most "
                f"255 bytes), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_resume(self) -> RunConfig:
        if self.resume and self.name is None:
            raise ValueError("resume=True needs the name of the run to resume; set name")
        return self

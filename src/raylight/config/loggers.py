"""Experiment loggers a run writes to (``RunConfig.loggers``): which, and their options.

Each entry is a logger's name (``"tensorboard"``) or its options, as a mapping with a
``type`` (``{"type": "mlflow", "tracking_uri": ...}``) or one of these models. The driver
writes them (``raylight.driver.loggers``); here is only the data.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from raylight.config.base import ConfigModel


class TensorBoard(ConfigModel):
    """TensorBoard event files: each report's numbers as scalars, the config as text."""

    type: Literal["tensorboard"] = Field("tensorboard", description="Always 'tensorboard'.")
    log_dir: str | None = Field(
        None,
        description="Directory of the event files. Default: <run directory>/tensorboard "
        "(needs a run directory on a local disk).",
    )


class MLflow(ConfigModel):
    """An MLflow run: each report's numbers as metrics, the config as parameters."""

    type: Literal["mlflow"] = Field("mlflow", description="Always 'mlflow'.")
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (a server, 'sqlite:///path/mlflow.db', 'databricks'). "
        "Default: MLFLOW_TRACKING_URI if set, else a local database, <run directory>/mlflow.db "
        "(offline; `mlflow ui --backend-store-uri sqlite:///...` shows it).",
    )
    experiment: str = Field("raylight", min_length=1, description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name. Default: the raylight run's name.")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags set on the MLflow run.")


class Wandb(ConfigModel):
    """A Weights & Biases run: each report's numbers as history, the config as its config."""

    type: Literal["wandb"] = Field("wandb", description="Always 'wandb'.")
    project: str = Field("raylight", min_length=1, description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (user or team). Default: W&B's own.")
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="'offline' writes the run under <dir>/wandb without network or API key "
        "(`wandb sync` uploads it later); 'online' streams it (needs `wandb login`).",
    )
    dir: str | None = Field(None, description="Where W&B writes its files. Default: the run directory (local).")
    run_name: str | None = Field(None, description="W&B run name. Default: the raylight run's name.")
    tags: list[str] = Field(default_factory=list, description="Tags of the W&B run.")


LOGGER_TYPES: dict[str, type[ConfigModel]] = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": Wandb}

LoggerSetting = Annotated[TensorBoard | MLflow | Wandb, Field(discriminator="type")]


def parse_loggers(value: Any) -> Any:
    """Names become ``{"type": name}``; an unknown type is one error naming the known ones."""
    if value is None:
        return []
    if isinstance(value, str | dict | ConfigModel):
        value = [value]
    if not isinstance(value, list | tuple):
        return value  # pydantic says what a list needed
    out = []
    for i, item in enumerate(value):
        kind = item.get("type") if isinstance(item, dict) else item if isinstance(item, str) else None
        if isinstance(item, dict | str) and kind not in LOGGER_TYPES:
            got = "has no 'type'" if kind is None else f"is an unknown logger, {kind!r}"
            raise ValueError(
                f"entry {i} {got}; the loggers are {', '.join(map(repr, LOGGER_TYPES))} "
                "(a name, or a mapping with a 'type' and the logger's options)"
            )
        out.append({"type": item} if isinstance(item, str) else item)
    return out

"""The ``adaptive`` section: batch size, accumulation and learning rate chosen online,
and the names of the learning-rate rules."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from raylight.config.base import ConfigModel

# How the learning rate follows the batch size; raylight.adaptive.lr implements each.
LRRule = Literal["adascale", "sqrt", "linear", "legw", "none"]
LR_RULES: tuple[str, ...] = get_args(LRRule)


class AdaptiveConfig(ConfigModel):
    """Batch size, gradient accumulation and learning rate chosen online for goodput."""

    max_batch_size: int | None = Field(
        None, ge=1, description="Largest global batch to consider. Default: 32x the initial batch. Never more than the "
        "training set (the adaptive loader's samples per epoch)."
    )
    local_batch_bounds: tuple[int, int] | None = Field(
        None,
        description="(min, max) samples per worker per micro-step (memory bounds). Default: "
        "(1, max_batch_size).",
    )
    accumulation: bool = Field(
        True, description="Allow gradient accumulation to reach batches beyond the memory bound."
    )
    lr_rule: LRRule = Field(
        "adascale",
        description="How the learning rate follows the batch size: adascale (SGD), sqrt "
        "(Adam family), linear, legw (linear with warm-up), none.",
    )
    lr_warmup_steps: float = Field(
        0.0, ge=0, description="legw: warm-up length in steps at the initial batch size."
    )
    gain_threshold: float = Field(
        0.05, ge=0, description="Change the batch size only for at least this predicted gain."
    )
    decision_interval_s: float = Field(
        3.0, gt=0, description="How often the driver refits the model and reconsiders."
    )
    min_profile_steps: int = Field(
        5, ge=1, description="Optimizer steps a layout needs before its timing is trusted."
    )
    profile_memory_steps: float | None = Field(
        500.0,
        gt=0,
        description="The throughput model follows recent step times: a step of a layout "
        "weighs exp(-n / this) once n more optimizer steps of that layout have run, so the "
        "model tracks a machine whose speed drifts; a poll's steps count as at most 2x the "
        "layout's recent mean, so a stall of a few seconds is not taken for its speed. None: "
        "every step weighs alike (AdaptDL).",
    )
    control_interval_steps: int = Field(
        16,
        ge=1,
        description="Every this many optimizer steps the workers agree on the plan and stop "
        "requests, and measure gradient noise; larger is cheaper but reacts later.",
    )
    noise_smoothing: float = Field(
        0.98, ge=0, lt=1, description="EMA smoothing of the gradient-noise statistics."
    )

    @field_validator("local_batch_bounds")
    @classmethod
    def _check_bounds(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1]:
            raise ValueError(f"needs 1 <= min <= max, got {value}")
        return value

"""The base of every config model, the core's and the declarative product's alike."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """Frozen, unknown keys are errors (naming the full key path), defaults validated too."""

    # NaN and infinity are never a valid setting: every float must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

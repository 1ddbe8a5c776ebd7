"""Turn pydantic's errors into messages that name the key path and the fix."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from raylight.base.exceptions import ConfigError

M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError, *, prefix: str = "") -> str:
    lines = []
    for item in err.errors():
        path = ".".join(str(p) for p in (prefix, *item["loc"]) if p != "")
        kind = item["type"]
        msg = item["msg"]
        if kind == "extra_forbidden":
            msg = "unknown key; check the spelling against the documented settings"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")  # our validators name the value already
        elif kind == "literal_error":
            msg = f"{msg} (got {_shown(item.get('input'))})"
        elif "input" in item and kind not in {"missing"}:
            msg = f"{msg} (got {_shown(item['input'])})"
        lines.append(f"  {path or '<root>'}: {msg}")
    return "invalid configuration:\n" + "\n".join(lines)


def _shown(value: Any, limit: int = 120) -> str:
    """The value a message quotes, short: a list of 300 features is its length, not its text."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, list | tuple | dict):
        return f"a {type(value).__name__} of {len(value)} items"
    return text[: limit - 3] + "..."


def validate(model: type[M], data: Any, *, prefix: str = "") -> M:
    """Validate ``data`` into ``model`` or raise a ConfigError naming each bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, prefix=prefix)) from None

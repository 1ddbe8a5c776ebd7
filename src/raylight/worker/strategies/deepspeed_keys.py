"""The keys of a DeepSpeed JSON config, checked against DeepSpeed's own schema.

DeepSpeed ignores a top-level key it does not read (``bogus_top`` trains as if it were
absent) and refuses a misspelt ZeRO key only when the engine is built in the workers.
The driver checks both before Ray starts, against what the installed DeepSpeed reads,
so the list cannot fall behind it:

- the top-level keys: those ``DeepSpeedConfig`` reads when it parses a config (recorded
  by parsing a config that records every key asked for), and the two that
  ``deepspeed.initialize`` reads beside it;
- ``zero_optimization`` and its sections (``offload_optimizer``, ``offload_param``, ...):
  the fields and aliases of ``DeepSpeedZeroConfig`` and of the models its fields hold.

Other sections' own keys are left to DeepSpeed. An unknown key is a ``ValueError`` naming
its path and the closest valid key.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import types
from typing import Any, Union, get_args, get_origin

# Read by deepspeed.initialize itself (a sequence-parallel mesh), not by DeepSpeedConfig.
_INITIALIZE_KEYS = ("sequence_parallel_size", "data_parallel_size")


class _Keys:
    """``config.keys()`` of a recording config: membership tests are recorded too."""

    def __init__(self, seen: set[str], keys: list[str]) -> None:
        self.seen, self.keys = seen, keys

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return key in self.keys

    def __iter__(self) -> Any:
        return iter(self.keys)


class _Recording(dict):
    """A config that records every top-level key DeepSpeed asks it for."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(str(key))
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(str(key))
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def keys(self) -> Any:
        return _Keys(self.seen, list(super().keys()))

    def __copy__(self) -> _Recording:
        return self  # DeepSpeed copies the dict it parses: the copy must record too


@functools.lru_cache(maxsize=1)
def top_level_keys() -> frozenset[str]:
    """Every top-level key the installed DeepSpeed reads."""
    deepspeed_config = _deepspeed().runtime.config.DeepSpeedConfig
    probe = _Recording({"__raylight_probe__": None})  # not empty: some sections are read only then
    parsed = deepspeed_config.__new__(deepspeed_config)
    parsed._param_dict = probe
    parsed._initialize_params(copy.copy(probe))
    return frozenset(probe.seen - {"__raylight_probe__"}) | frozenset(_INITIALIZE_KEYS)


def zero_model() -> Any:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    _deepspeed()
    return DeepSpeedZeroConfig


def _deepspeed() -> Any:
    """DeepSpeed, imported for the CPU accelerator unless this process chose one already
    (the driver only reads its schema; the workers choose their own)."""
    from raylight.worker.strategies.deepspeed import import_deepspeed

    before = os.environ.get("DS_ACCELERATOR")
    if before is None:
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        return import_deepspeed()
    finally:
        if before is None:
            os.environ.pop("DS_ACCELERATOR", None)


def _model_keys(model: Any) -> dict[str, Any]:
    """A pydantic model's keys (field names and aliases) -> the model a key's value is,
    where it is one (else None)."""
    from pydantic import BaseModel

    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        options = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
        inner = next((o for o in options if isinstance(o, type) and issubclass(o, BaseModel)), None)
        keys[name] = inner
        if field.alias:
            keys[field.alias] = inner
    return keys


def _unknown(path: str, key: str, valid: Any) -> ValueError:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {close[0]!r}?"
    elif len(valid) <= 15:
        hint = f"valid keys here: {sorted(valid)}."
    else:
        hint = f"no valid key is close (DeepSpeed's config reference lists its {len(valid)} keys)."
    return ValueError(
        f"config {path}: unknown DeepSpeed key (DeepSpeed {_version()} does not read it); {hint} "
        "Fix the spelling or remove the key"
    )


def _version() -> str:
    return str(getattr(_deepspeed(), "__version__", "?"))


def check_keys(config: dict[str, Any]) -> None:
    """Every key of ``config`` (a DeepSpeed JSON config) is one DeepSpeed reads: top-level
    keys, and ``zero_optimization``'s at any depth; a ``ValueError`` naming the first
    unknown key's path and the closest valid one."""
    top = top_level_keys()
    for key in config:
        if key not in top:
            raise _unknown(str(key), str(key), top)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        _check_model(zero, zero_model(), "zero_optimization")


def _check_model(section: dict[str, Any], model: Any, path: str) -> None:
    keys = _model_keys(model)
    for key, value in section.items():
        where = f"{path}.{key}"
        if key not in keys:
            raise _unknown(where, str(key), keys)
        if keys[key] is not None and isinstance(value, dict):
            _check_model(value, keys[key], where)

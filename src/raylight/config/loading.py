"""YAML in, validated config out: file loading (any fsspec URI) and dotted overrides."""

from __future__ import annotations

import copy
from typing import Any

import fsspec
import yaml

from raylight.config.declarative import ModelConfig
from raylight.config.validation import validate
from raylight.exceptions import ConfigError


def load_yaml(path: str) -> dict[str, Any]:
    try:
        with fsspec.open(path, "r") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist; check the path") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping (key: value), got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML; list items by index)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key.path=value, e.g. trainer.epochs=5")
        value = yaml.safe_load(raw)
        parts = key.split(".")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[: i + 1])} is not an index of the list")
                node = node[int(part)]
            else:
                node = node.setdefault(part, [] if nxt.isdigit() else {})
        last = parts[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise ConfigError(f"override {key!r}: {last} is not an index of the list")
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"override {key!r}: {'.'.join(parts[:-1])} is not a mapping")
    return out


def load_config(path: str, overrides: list[str] | None = None) -> ModelConfig:
    return validate(ModelConfig, apply_overrides(load_yaml(path), overrides or []))


def render_config(config: ModelConfig) -> str:
    """The fully resolved config as YAML, every default written out."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)

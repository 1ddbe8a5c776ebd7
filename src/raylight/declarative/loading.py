"""YAML in, validated config out: file loading (any fsspec URI) and dotted overrides."""

from __future__ import annotations

import copy
from typing import Any

import fsspec
import yaml

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.model import ModelConfig
from raylight.declarative.keypath import KeyPathError, assign
from raylight.declarative.suggest import validate_config


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of ``path`` (any fsspec URI), or a ConfigError that names the file,
    says what is wrong with it and how to fix it."""
    try:
        with fsspec.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path!r} is a directory; pass a file") from None
    except PermissionError:
        raise ConfigError(f"{what} {path!r} cannot be read: permission denied") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what} {path!r} cannot be read: {exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {path!r} is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); "
            "save it as UTF-8"
        ) from None


def load_yaml(path: str) -> dict[str, Any]:
    text = read_text_file(path, "config file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    if data is None:
        raise ConfigError(f"config file {path!r} is empty; it needs at least input_features and output_features")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping (key: value), got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML; list items by index)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like key.path=value, e.g. trainer.epochs=5")
        parts = key.split(".")
        if any(not part for part in parts):
            raise ConfigError(f"override {key!r}: a key path has no empty parts (e.g. trainer.epochs)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(
                f"override {item!r}: the value {raw!r} is not valid YAML ({problem}); quote it, "
                "e.g. --set 'name=\"text\"'"
            ) from None
        try:
            assign(out, parts, value, create=True)
        except KeyPathError as err:
            if err.problem == "index" and err.at < len(parts) - 1:
                raise ConfigError(f"override {key!r}: {err.where} is not an index of the list (it has {err.size} items)") from None
            if err.problem == "index":
                raise ConfigError(f"override {key!r}: {parts[-1]} is not an index of the list") from None
            raise ConfigError(f"override {key!r}: {err.parent or '<root>'} is a value, not a section") from None
    return out


def load_config(path: str, overrides: list[str] | None = None) -> ModelConfig:
    return validate_config(apply_overrides(load_yaml(path), overrides or []))


def render_config(config: ModelConfig) -> str:
    """The fully resolved config as YAML, every default written out."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)

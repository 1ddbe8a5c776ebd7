"""A trained model's directory (``<output-directory>/model``), checked without torch.

``raylight predict`` and ``evaluate`` check the directory here before anything imports
torch or starts anything, so a broken one is named in about a second: the files exist,
``model.json`` parses, is of a format this raylight reads and holds a valid config, and
``weights.safetensors`` has a whole header. What needs the model built (weights whose
shapes do not fit it) is checked when it is loaded (``train.LoadedModel``).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from raylight.base.exceptions import ConfigError

# Format 2: a decoder per output (``decoders.<output>.*``); format 1's one decoder
# (``decoder.*``) loads as its one output's.
MODEL_FILE, WEIGHTS_FILE, MODEL_FORMAT = "model.json", "weights.safetensors", 2
READ_FORMATS = (1, 2)
_MAX_HEADER = 100_000_000  # safetensors' own bound on its JSON header


def damaged_note(path: str) -> str:
    return f"the model directory {path!r} is damaged or not raylight's; train again, or restore it from the run"


def check_model_dir(path: str) -> tuple[Any, dict[str, Any]]:
    """The config (a ``ModelConfig``) and preprocessing metadata of the model directory
    ``path``, after every check that needs no torch; a ConfigError naming the file otherwise."""
    from raylight.declarative.suggest import validate_config

    if not os.path.exists(path):
        raise ConfigError(f"model path {path!r} does not exist; pass <output-directory>/model of a trained run")
    if not os.path.isdir(path):
        raise ConfigError(f"model path {path!r} is a file; pass the model directory, <output-directory>/model")
    model_json = os.path.join(path, MODEL_FILE)
    if not os.path.exists(model_json):
        raise ConfigError(f"{path!r} is not a raylight model directory (no {MODEL_FILE}); pass <output-directory>/model")
    damaged = damaged_note(path)
    saved = _read_model_json(model_json, damaged)
    fmt = saved.get("format", 1)
    if fmt not in READ_FORMATS:
        raise ConfigError(
            f"{model_json!r} has format {fmt!r}; this raylight reads formats {', '.join(map(str, READ_FORMATS))} "
            "(a model written by a newer raylight needs that version)"
        )
    config = validate_config(saved["config"], prefix=f"{model_json} config")
    _check_weights_header(os.path.join(path, WEIGHTS_FILE), damaged)
    return config, saved["meta"]


def _read_model_json(path: str, damaged: str) -> dict[str, Any]:
    from raylight.declarative.loading import read_text_file

    try:
        saved = json.loads(read_text_file(path, "model file"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path!r} is not valid JSON ({exc}): {damaged}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) or not isinstance(saved.get("meta"), dict):
        raise ConfigError(f"{path!r} lacks its config and preprocessing metadata: {damaged}")
    return saved


def _check_weights_header(path: str, damaged: str) -> None:
    """The safetensors layout: an 8-byte little-endian header length, that many bytes of
    JSON, then the tensors' bytes, which the header's offsets must stay within."""
    if not os.path.exists(path):
        raise ConfigError(f"the weights file {path!r} is missing: {damaged}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 0 < length <= min(_MAX_HEADER, size - 8):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        ends = [e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"]
        if max(ends, default=0) > size - 8 - length:
            raise ValueError(f"its tensors need {max(ends)} bytes, the file holds {size - 8 - length}")
    except OSError as exc:
        raise ConfigError(f"the weights file {path!r} cannot be read ({exc.strerror or exc}): {damaged}") from None
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        raise ConfigError(f"the weights file {path!r} cannot be read ({exc}): {damaged}") from None

"""Hyperparameter search over a declarative config: setting a dotted key path
(``set_path``, with Ludwig's spellings of them), and checking that a parameter names a
value its whole space may take (``check_parameter``, which ``ModelConfig`` runs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import (
    ValidationError,
)

from raylight.declarative.features import FEATURES
from raylight.declarative.keypath import KeyPathError, assign
from raylight.declarative.ludwig.spellings import (
    combiner_layers,
    feature_level_paths,
    feature_paths,
    raylight_key,
)


def representatives(space: Any) -> list[Any]:
    if space.space == "choice":
        return list(space.categories)
    if space.space == "grid":
        return list(space.values)
    if space.space == "randint":
        return [space.lower, space.upper - 1]
    return [space.lower, space.upper]


def _retyped_encoder(data: dict[str, Any], parts: list[str], kind: Any) -> dict[str, Any] | None:
    """The encoder section of feature ``parts[:2]`` as a ``kind`` encoder, where its type's
    config says how (``retyped``: a search over text encoder types starts each type from its
    own defaults, keeping the settings the config changed that it has too); else None."""
    try:
        feature = data[parts[0]][int(parts[1])]
        section = feature["encoder"]
        model = FEATURES[feature["type"]].Input.model_fields["encoder"].annotation
    except (KeyError, IndexError, ValueError, TypeError):
        return None  # set as it is, and fail there with the usual message
    # the encoder's model says how, or (a union of models, an image's) the type's module
    retyped = getattr(model, "retyped", None) or getattr(FEATURES[feature["type"]], "retyped_encoder", None)
    if retyped is None or not isinstance(section, dict) or section.get("type") == kind:
        return None
    return retyped(section, kind)


def set_path(data: dict[str, Any], key: str, value: Any, own: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A copy of ``data`` with the dotted ``key`` (list items by index) set to ``value``;
    KeyError naming the first part that does not exist. A key may start with a feature's
    name, Ludwig's hyperopt spelling (``review.encoder.type``: that feature's
    ``encoder.type``; a config section of the same name comes first); an output's
    ``loss.weight`` is its ``loss_weight``. Setting a text-like
    encoder's ``type`` starts it from that type's defaults (``TextEncoder.retyped``). Ludwig's
    ``combiner.num_fc_layers`` / ``combiner.output_size`` set the number of
    ``combiner.fc_layers`` (copies of the first, or of 256 units) or every layer's size.
    Ludwig's feature-level ``defaults.<type>.<section>.<key>`` sets the key on every feature
    of that type that leaves it to its defaults (``own``: what the config as written set,
    ``ModelConfig._own``). Ludwig's spellings are ``ludwig.spellings``'."""
    if key.startswith("defaults."):
        out = data
        for path in feature_level_paths(data, key, own or {}):
            out = set_path(out, path, value, own)
        return out
    features = feature_paths(data)
    key = raylight_key(data, key, features)
    parts = key.split(".")
    if len(parts) == 4 and parts[2:] == ["encoder", "type"] and parts[0] in ("input_features", "output_features"):
        retyped = _retyped_encoder(data, parts, value)
        if retyped is not None:
            return set_path(data, ".".join(parts[:3]), retyped)
    if (layered := combiner_layers(data, key, value)) is not None:
        return layered
    out = copy.deepcopy(data)
    try:
        assign(out, key.split("."), value, create=False)
    except KeyPathError as err:
        if err.problem == "index":
            raise KeyError(f"{err.where} is not an index of a list of {err.size}") from None
        if err.problem == "key":
            names = f"; or a feature's name (Ludwig's <feature>.<key>): {sorted(features)}" if err.at == 0 else ""
            raise KeyError(f"{err.where} is not a key of the config; keys there: {err.keys}{names}") from None
        if err.found is None:  # an optional section left out, as the config holds it
            raise KeyError(
                f"{err.parent} is not set (null): write the section into the config to search its "
                f"keys ({err.parts[err.at - 1]}: {{}} takes its defaults)"
            ) from None
        raise KeyError(f"{err.parent} is a value, not a section") from None
    return out


def preprocessing_sections(data: dict[str, Any]) -> dict[str, Any]:
    """What decides a config's preprocessing (a dumped ModelConfig): the dataset's
    ``preprocessing`` section and each feature's, by path."""
    sections = {"preprocessing": data.get("preprocessing")}
    for side in ("input_features", "output_features"):
        for i, feature in enumerate(data.get(side) or []):
            if isinstance(feature, dict) and "preprocessing" in feature:
                sections[f"{side}.{i}.preprocessing ({feature.get('name')})"] = feature["preprocessing"]
    return sections


def _preprocessing_changed(base: dict[str, Any], trial: dict[str, Any]) -> str | None:
    """Where ``trial`` preprocesses otherwise than ``base``; None when nowhere."""
    was, now = preprocessing_sections(base), preprocessing_sections(trial)
    return next((where for where in now if now[where] != was.get(where)), None)


def space_values(space: Any) -> list[Any]:
    """The values of a finite space (choice, grid)."""
    return list(space.categories if space.space == "choice" else space.values)


def check_parameter(
    base: dict[str, Any], key: str, space: Any, own: dict[str, dict[str, Any]], validate: Callable[[Any], Any]
) -> bool:
    """``key`` names a config value, and every corner of ``space`` is a valid value.
    True when the key changes preprocessing, which takes a finite space: each of its
    values is preprocessed once, before the trials (``hyperopt.preprocessing_variants``)."""
    if key.split(".")[0] == "hyperopt":
        raise ValueError(f"parameters.{key}: the hyperopt section itself cannot be searched")
    preprocessing = False
    for candidate in representatives(space):
        try:
            trial = set_path(base, key, candidate, own)
        except KeyError as exc:
            raise ValueError(f"parameters.{key}: {exc.args[0]}") from None
        if (where := _preprocessing_changed(base, trial)) is not None:
            if space.space not in ("choice", "grid"):
                raise ValueError(
                    f"parameters.{key}: changes {where}, and the dataset is preprocessed once for each "
                    f"value before the trials: give it a choice or grid space, not {space.space}"
                )
            preprocessing = True
        try:
            validate(trial)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"parameters.{key}: the value {candidate!r} of its {space.space} space is not valid there "
                f"({where}: {first['msg']})"
            ) from None
    return preprocessing

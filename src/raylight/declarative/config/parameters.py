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


def representatives(space: Any) -> list[Any]:
    if space.space == "choice":
        return list(space.categories)
    if space.space == "grid":
        return list(space.values)
    if space.space == "randint":
        return [space.lower, space.upper - 1]
    return [space.lower, space.upper]


# Ludwig's searchable spellings of the combiner's layers (its hyperopt examples tune them).
LUDWIG_LAYER_KEYS = ("combiner.num_fc_layers", "combiner.output_size")
# Ludwig's feature-level hyperopt parameters, defaults.<type>.<section>.<key>: the side
# each section is set on.
FEATURE_LEVEL = {"preprocessing": "input_features", "encoder": "input_features", "decoder": "output_features", "loss": "output_features"}


def _feature_names(data: dict[str, Any]) -> dict[str, str]:
    """Each feature's name -> its path (``input_features.<i>`` / ``output_features.<i>``)."""
    return {
        feat["name"]: f"{section}.{i}"
        for section in ("input_features", "output_features")
        for i, feat in enumerate(data.get(section) or [])
        if isinstance(feat, dict) and isinstance(feat.get("name"), str)
    }


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
    retyped = getattr(model, "retyped", None)
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
    ``ModelConfig._own``; ``_feature_level``)."""
    if key.startswith("defaults."):
        return _feature_level(data, key, value, own or {})
    head, _, rest = key.partition(".")
    features = _feature_names(data)
    if head not in data and head in features and rest:
        key = f"{features[head]}.{rest}"
    parts = key.split(".")
    if len(parts) == 4 and parts[0] == "output_features" and parts[2:] == ["loss", "weight"]:
        parts[2:] = ["loss_weight"]  # Ludwig's loss.weight
        key = ".".join(parts)
    if len(parts) == 4 and parts[2:] == ["encoder", "type"] and parts[0] in ("input_features", "output_features"):
        retyped = _retyped_encoder(data, parts, value)
        if retyped is not None:
            return set_path(data, ".".join(parts[:3]), retyped)
    out = copy.deepcopy(data)
    if key in LUDWIG_LAYER_KEYS and isinstance(out.get("combiner"), dict):
        layers = list(out["combiner"].get("fc_layers") or [])
        first = dict(layers[0]) if layers else {"output_size": 256}
        if key.endswith("num_fc_layers"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise KeyError(f"combiner.num_fc_layers takes a whole number of layers from 0, got {value!r}")
            out["combiner"]["fc_layers"] = [dict(first) for _ in range(value)]
        else:
            out["combiner"]["fc_layers"] = [{**layer, "output_size": value} for layer in layers]
        return out
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


def _feature_level(data: dict[str, Any], key: str, value: Any, own: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Ludwig's feature-level hyperopt parameter ``defaults.<type>.<section>.<key>``, as
    Ludwig applies it (its value goes into the ``defaults`` section, which fills in what
    each feature leaves out): ``<section>.<key>`` on each input (``preprocessing``,
    ``encoder``) or output (``decoder``, ``loss``) feature of that type, but those that
    set it themselves, and, for an encoder's or decoder's settings, those that name a
    ``type`` of their own other than the defaults' ("the default encoder"). KeyError when
    it reaches no feature."""
    parts = key.split(".")
    if len(parts) < 4 or parts[2] not in FEATURE_LEVEL:
        raise KeyError(
            "Ludwig's feature-level parameters are defaults.<feature type>.<section>.<key>, "
            f"the section one of {', '.join(FEATURE_LEVEL)}"
        )
    kind, section, setting = parts[1], parts[2], ".".join(parts[3:])
    side = FEATURE_LEVEL[section]
    features = [f for f in data.get(side) or [] if isinstance(f, dict)]
    of_kind = [i for i, f in enumerate(data.get(side) or []) if isinstance(f, dict) and f.get("type") == kind]
    if not of_kind:
        types = sorted({str(f.get("type")) for f in features})
        raise KeyError(f"no {side.removesuffix('_features')} feature has type {kind!r} (their types: {types})")
    default_type = own.get("defaults", {}).get(f"{kind}.{section}.type", _builtin_encoder_type(kind) if section == "encoder" else None)
    out, reached = data, 0
    for i in of_kind:
        mine = own.get(f"{side}.{i}", {})
        if f"{section}.{setting}" in mine:
            continue  # the feature's own setting wins over its defaults
        if setting != "type" and f"{section}.type" in mine and mine[f"{section}.type"] != default_type:
            continue  # not the default encoder (decoder)
        out = set_path(out, f"{side}.{i}.{section}.{setting}", value, own)
        reached += 1
    if not reached:
        raise KeyError(
            f"every {kind} {side.removesuffix('_features')} feature sets {section}.{setting} itself, or names "
            f"another {section} type than the defaults', so the parameter would change nothing; "
            f"search <feature name>.{section}.{setting} instead"
        )
    return out


def _builtin_encoder_type(kind: str) -> Any:
    """The encoder type a ``kind`` input feature has when nothing names one."""
    try:
        feature = FEATURES[kind].Input.model_validate({"name": "x", "type": kind})
    except (KeyError, ValidationError):
        return None
    return getattr(getattr(feature, "encoder", None), "type", None)


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

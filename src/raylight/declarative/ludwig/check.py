"""Applying ``keys.py``'s tables to a config: each Ludwig key raylight does not take is
dropped at a neutral value, dropped with one warning line where it means nothing here
(``IGNORED_KEYS``), moved where raylight has it under another key, or a problem at its
key path with the fix, after merging Ludwig's ``defaults`` section into the features as
Ludwig does; and what a config as written set itself (``own_settings``). The problems are
returned, not raised: ``ModelConfig`` reports them with pydantic's errors of the rest, all
at once."""

from __future__ import annotations

import difflib
import logging
from typing import Any

from pydantic_core import InitErrorDetails

from raylight.declarative.ludwig.errors import value_error
from raylight.declarative.ludwig.keys import (
    ANY,
    FC_LAYER_KEYS,
    FEATURE_KEYS,
    IGNORED_FEATURE_KEYS,
    IGNORED_KEYS,
    LUDWIG_COMBINERS,
    LUDWIG_ENCODER_TYPES,
    LUDWIG_IMAGE_ENCODERS,
    LUDWIG_KEYS,
    LUDWIG_VALUES,
)
from raylight.declarative.ludwig.spellings import image_encoder_from_ludwig

log = logging.getLogger(__name__)


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _same(value: Any, neutral: Any) -> bool:
    if neutral is ANY:
        return True
    if isinstance(value, bool) or isinstance(neutral, bool):  # False is not 0 here
        return value is neutral
    return bool(value == neutral)


def _without(data: dict[str, Any], path: str) -> dict[str, Any]:
    """A copy of ``data`` without ``path`` (copying only the sections on the way)."""
    head, _, rest = path.partition(".")
    out = dict(data)
    if rest:
        out[head] = _without(out[head], rest)
    else:
        del out[head]
    return out


def _loss_weight(feature: dict[str, Any], loc: tuple[Any, ...], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """An output's Ludwig ``loss.weight`` as its ``loss_weight`` (the section goes if that
    leaves it empty); both, at different values, is an error."""
    found, value = _lookup(feature, "loss.weight")
    if not found:
        return feature
    if "loss_weight" in feature and feature["loss_weight"] != value:
        fix = f"Ludwig's spelling of loss_weight, which the feature gives too ({feature['loss_weight']!r}); keep one"
        errors.append(_error((*loc, "loss", "weight"), fix, value))
        return _without(feature, "loss")
    feature = _without(feature, "loss.weight")
    if feature.get("loss") == {}:
        feature = _without(feature, "loss")
    return {**feature, "loss_weight": value}


def _feature_rules(side: str, kind: Any, table: dict[tuple[str, str], dict[str, Any]] = FEATURE_KEYS) -> dict[str, Any]:
    rules = dict(table.get((side, "*"), {}))
    rules.update(table.get((side, kind), {}))
    return rules


# An output's decoder layers as Ludwig 0.17 takes them from its keys before 0.6, on the
# output itself (Ludwig's backward_compatibility moves them into the decoder): key on the
# output -> key in the decoder section.
_OUTPUT_DECODER_KEYS = {
    "fc_layers": "fc_layers", "num_fc_layers": "num_fc_layers", "output_size": "fc_output_size",
    "activation": "fc_activation", "dropout": "fc_dropout", "norm": "fc_norm", "use_bias": "fc_use_bias",
}


# Ludwig's mlp_classifier decoder (binary, category): num_fc_layers (default 1) layers of
# output_size (256) units before the classifier's linear layer, as raylight's decoder
# layers (the keys as the decoder section spells them).
_MLP_CLASSIFIER = {"output_size": "fc_output_size", "activation": "fc_activation", "dropout": "fc_dropout", "use_bias": "fc_use_bias"}


def _mlp_classifier(decoder: dict[str, Any]) -> dict[str, Any]:
    out = {_MLP_CLASSIFIER.get(k, k): v for k, v in decoder.items() if k != "type"}
    out.setdefault("num_fc_layers", 1)
    return out


def _decoder_keys(feature: dict[str, Any], loc: tuple[Any, ...], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """``feature`` (an output) with Ludwig's decoder layer keys given on it moved into its
    ``decoder`` section (and an mlp_classifier decoder as raylight's decoder layers); one
    given in both at different values is an error."""
    decoder = feature.get("decoder")
    classifier = feature.get("type") in ("binary", "category")
    if isinstance(decoder, dict) and decoder.get("type") == "mlp_classifier" and classifier:
        feature = {**feature, "decoder": _mlp_classifier(decoder)}
    if classifier and "calibration" in feature:  # Ludwig's output-level switch: temperature scaling
        calibration = feature["calibration"]
        feature = {k: v for k, v in feature.items() if k != "calibration"}
        if calibration is not False:
            feature = {**feature, "decoder": {"calibration": "temperature_scaling" if calibration is True else calibration, **(feature.get("decoder") or {})}}
    moved = {key: ours for key, ours in _OUTPUT_DECODER_KEYS.items() if key in feature}
    decoder = feature.get("decoder")
    if not moved or (decoder is not None and not isinstance(decoder, dict)):
        return feature  # nothing to move, or pydantic's error for a decoder that is no section
    section = dict(decoder or {})
    for key, ours in moved.items():
        value = feature[key]
        if ours in section and section[ours] != value:
            fix = f"Ludwig's old spelling of decoder.{ours}, which the output gives too ({section[ours]!r}); keep one"
            errors.append(_error((*loc, key), fix, value))
        section.setdefault(ours, value)
    return {**{k: v for k, v in feature.items() if k not in _OUTPUT_DECODER_KEYS}, "decoder": section}


# An input's own keys in Ludwig's spelling before 0.6, where ``encoder`` names the type and
# the encoder's settings sit on the input itself (Ludwig's backward_compatibility moves them
# into the encoder section): every other key goes there.
_INPUT_OWN_KEYS = frozenset({"name", "type", "column", "proc_column", "tied", "active", "preprocessing", "augmentation", "encoder"})


def _encoder_keys(feature: dict[str, Any]) -> dict[str, Any]:
    """``feature`` (an input) with an ``encoder`` given as its type name (Ludwig before 0.6)
    as an encoder section of that type and the input's encoder settings."""
    kind = feature.get("encoder")
    if not isinstance(kind, str):
        return feature
    moved = {k: v for k, v in feature.items() if k not in _INPUT_OWN_KEYS}
    return {**{k: v for k, v in feature.items() if k in _INPUT_OWN_KEYS}, "encoder": {"type": kind, **moved}}


def _other_encoders(feature: dict[str, Any], loc: tuple[Any, ...], notes: list[str]) -> dict[str, Any]:
    """``feature`` (a text or sequence input) without the settings of other encoder types
    in its encoder section (Ludwig's test helpers give every sequence encoder's sizes to
    each), as Ludwig drops them: one note naming them."""
    from raylight.declarative.features.text import other_types_settings

    encoder = feature.get("encoder")
    if feature.get("type") not in ("text", "sequence") or not isinstance(encoder, dict):
        return feature
    given, owners = other_types_settings(encoder)
    if not given:
        return feature
    notes.append(
        f"{'.'.join(str(p) for p in (*loc, 'encoder'))}.{{{', '.join(given)}}}: settings of the {', '.join(owners)} "
        f"encoders, not of {encoder.get('type', 'embed')} (Ludwig ignores them too)"
    )
    return {**feature, "encoder": {k: v for k, v in encoder.items() if k not in given}}


def _image_encoder_refusal(kind: str, encoder: dict[str, Any]) -> str:
    """Why Ludwig's pre-trained image encoder ``kind`` is refused."""
    wants = encoder.get("use_pretrained", True) is not False
    why = "use_pretrained: true cannot be satisfied offline, and " if wants else ""
    return (
        f"Ludwig's {kind} image encoder is built around downloaded pre-trained weights, and raylight downloads none "
        f"({why}raylight has no {kind} to train from scratch); use stacked_cnn, mlp_mixer, or resnet or vit with "
        "use_pretrained: false (trained from scratch), and remove the encoder's other keys"
    )


def _encoder_type(feature: dict[str, Any], loc: tuple[Any, ...], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """``feature`` without an encoder section of a type of Ludwig's that raylight lacks (one
    of Ludwig's pre-trained image encoders, ``LUDWIG_IMAGE_ENCODERS``, or another feature
    type's in ``LUDWIG_ENCODER_TYPES``), that a problem at ``encoder.type`` saying why (its
    other keys are that type's: not reported one by one)."""
    encoder = feature.get("encoder")
    if not isinstance(encoder, dict) or not isinstance(kind := encoder.get("type"), str):
        return feature
    if feature.get("type") == "image":
        fix = _image_encoder_refusal(kind, encoder) if kind in LUDWIG_IMAGE_ENCODERS else None
    else:
        missing = LUDWIG_ENCODER_TYPES.get(str(feature.get("type")), {}).get(kind)
        fix = None if missing is None else f"Ludwig's setting, not raylight's: {missing}"
    if fix is None:
        return feature
    errors.append(_error((*loc, "encoder", "type"), fix, kind))
    return {k: v for k, v in feature.items() if k != "encoder"}


def _check_features(
    data: dict[str, Any], errors: list[InitErrorDetails], inherited: dict[tuple[str, int], set[str]], notes: list[str],
) -> dict[str, Any]:
    """``data`` without each feature's neutral Ludwig keys; the others added to ``errors``,
    at ``defaults.<type>.<key>`` where the feature took the key from there (``inherited``)."""
    for side in ("input", "output"):
        key = f"{side}_features"
        features = data.get(key)
        if not isinstance(features, list):
            continue
        kept = []
        for i, feature in enumerate(features):
            if isinstance(feature, dict):
                own: list[InitErrorDetails] = []
                if side == "output":
                    feature = _decoder_keys(_loss_weight(feature, (key, i), own), (key, i), own)
                else:
                    feature = image_encoder_from_ludwig(_encoder_keys(feature))
                    feature = _encoder_type(_other_encoders(feature, (key, i), notes), (key, i), own)
                feature = _ignored(feature, _feature_rules(side, feature.get("type"), IGNORED_FEATURE_KEYS), (key, i), notes)
                feature = _apply(feature, _feature_rules(side, feature.get("type")), (key, i), own)
                for error in own:
                    path = ".".join(str(p) for p in error["loc"][2:])
                    if path in inherited.get((key, i), set()):
                        error = {**error, "loc": ("defaults", str(feature.get("type")), *error["loc"][2:])}
                    if not any(e.get("loc") == error["loc"] for e in errors):  # two features may take one default
                        errors.append(error)
            kept.append(feature)
        data = {**data, key: kept}
    return data


def _apply(
    data: dict[str, Any], rules: dict[str, tuple[str, tuple[Any, ...]]], loc: tuple[Any, ...], errors: list[InitErrorDetails],
) -> dict[str, Any]:
    """``data`` (a config, or one feature at ``loc``) without the keys of ``rules`` at their
    neutral values (and the sections that leaves empty); the others added to ``errors``."""
    for path, (fix, neutral) in rules.items():
        found, value = _lookup(data, path)
        if not found:
            continue
        if any(_same(value, v) for v in neutral):
            data = _without(data, path)
            parts = path.split(".")
            for depth in range(len(parts) - 1, 0, -1):  # the sections left empty, innermost first
                head = ".".join(parts[:depth])
                if _lookup(data, head)[1] != {}:
                    break
                data = _without(data, head)
        else:
            errors.append(_error((*loc, *path.split(".")), f"Ludwig's setting, not raylight's: {fix}", value))
            # Reported here, not again as an unknown key; a type refused takes its section's
            # other keys (that type's: an objectosphere loss's xi) with it.
            data = _without(data, path.removesuffix(".type") if path.endswith(".type") and "." in path else path)
    return data


def _ignored(data: dict[str, Any], rules: dict[str, str], loc: tuple[Any, ...], notes: list[str]) -> dict[str, Any]:
    """``data`` without the keys of ``rules`` (Ludwig's, with no meaning in raylight), each
    added to ``notes`` as its key path and note."""
    for path, note in rules.items():
        if _lookup(data, path)[0]:
            notes.append(f"{'.'.join(str(p) for p in (*loc, path))}: {note}")
            data = _without(data, path)
    return data


def say_ignored(notes: list[str]) -> None:
    """One warning line per Ludwig key ``check_ludwig_keys`` ignored."""
    for note in notes:
        log.warning("ignored Ludwig key %s", note)


def _with_defaults(
    data: dict[str, Any], errors: list[InitErrorDetails], inherited: dict[tuple[str, int], set[str]],
) -> dict[str, Any]:
    """Ludwig's ``defaults`` section merged into the features, as Ludwig merges it
    (``merge_with_defaults``): each feature takes its type's preprocessing and encoder
    (inputs) or decoder and loss (outputs) where it does not set them, a section merged key
    by key unless the feature names another ``type`` for it; then the section goes.
    ``inherited`` gets, per feature, the key paths it took from the section."""
    if "defaults" not in data:
        return data
    defaults = data["defaults"]
    if defaults is None:
        return {k: v for k, v in data.items() if k != "defaults"}
    if not isinstance(defaults, dict) or not all(isinstance(v, dict) for v in defaults.values()):
        errors.append(_error(("defaults",), "Ludwig's defaults: a mapping of feature type to its sections, e.g. {category: {encoder: {embedding_size: 16}}}", defaults))
        return data
    out = {k: v for k, v in data.items() if k != "defaults"}
    for key, excluded in (("input_features", {"decoder", "loss"}), ("output_features", {"encoder", "preprocessing"})):
        features = out.get(key)
        if isinstance(features, list):
            merged = []
            for i, f in enumerate(features):
                if isinstance(f, dict):
                    m = _merged({k: v for k, v in defaults.get(f.get("type"), {}).items() if k not in excluded}, f)
                    inherited[(key, i)] = _leaves(m) - _leaves(f)
                    f = m
                merged.append(f)
            out[key] = merged
    return out


def own_settings(data: Any) -> dict[str, dict[str, Any]]:
    """What a config as written sets itself: per feature (``input_features.<i>``,
    ``output_features.<i>``) its settings by dotted path, before Ludwig's ``defaults``
    section fills them in, and that section's own (``defaults``: ``<type>.<section>.<key>``).
    Ludwig's feature-level hyperopt parameters (``defaults.<type>...``, ``set_path``) reach
    only what a feature leaves to its defaults."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(data, dict):
        return out
    for side in ("input_features", "output_features"):
        features = data.get(side)
        for i, feature in enumerate(features if isinstance(features, list) else []):
            if isinstance(feature, dict):
                out[f"{side}.{i}"] = _leaf_values(feature)
    if isinstance(data.get("defaults"), dict):
        out["defaults"] = _leaf_values(data["defaults"])
    return out


def _leaf_values(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        path = f"{prefix}{k}"
        out.update(_leaf_values(v, f"{path}.") if isinstance(v, dict) and v else {path: v})
    return out


def _leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    """The dotted paths of ``data``'s values that are not sections."""
    return set(_leaf_values(data, prefix))


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        b = out.get(k)
        if isinstance(b, dict) and isinstance(v, dict) and v.get("type", b.get("type")) == b.get("type"):
            out[k] = _merged(b, v)
        else:
            out[k] = v
    return out


def check_ludwig_keys(data: Any, combiners: tuple[str, ...]) -> tuple[Any, list[InitErrorDetails], list[str]]:
    """``data`` without the Ludwig keys whose values do what raylight does anyway (their
    neutral values) or that mean nothing here (each said in a warning line), with those
    raylight spells otherwise moved; and the problems of every other Ludwig key (and
    value) of ``data`` that raylight does not take, each at its key path with the fix,
    the keys themselves dropped (so that they are not reported again as unknown).
    ``combiners``: the combiner types raylight has. Third, the keys ignored, each with its
    note (``say_ignored`` says them)."""
    errors: list[InitErrorDetails] = []
    notes: list[str] = []
    if not isinstance(data, dict):
        return data, errors, notes
    data = _dotted_metric(_optuna_executor(data, errors, notes), errors)
    for (path, given), fix in LUDWIG_VALUES.items():
        found, value = _lookup(data, path)
        if found and value == given:  # the section goes: its other keys are that type's
            errors.append(_error(tuple(path.split(".")), fix, value))
            data = _without(data, path.removesuffix(".type"))
    data = _combiner_type(data, combiners, errors)
    inherited: dict[tuple[str, int], set[str]] = {}
    data = _ignored(_optimizer_lr(_with_defaults(data, errors, inherited), errors), IGNORED_KEYS, (), notes)
    data = _check_features(_apply(data, LUDWIG_KEYS, (), errors), errors, inherited, notes)
    data = {**data, "combiner": _fc_layers(data.get("combiner"), ("combiner",), errors)} if "combiner" in data else data
    if isinstance(data.get("input_features"), list):  # an encoder's layers (a date's)
        data = {**data, "input_features": [
            {**f, "encoder": _fc_layers(f["encoder"], ("input_features", i, "encoder"), errors)}
            if isinstance(f, dict) and "encoder" in f else f
            for i, f in enumerate(data["input_features"])
        ]}
    return data, errors, notes


# Ludwig 0.17's optuna executor: Optuna's samplers raylight's search_alg optuna has (TPE;
# auto is Optuna's AutoSampler, TPE where that is missing).
_OPTUNA_SAMPLERS = ("auto", "tpe", None)


def _optuna_executor(data: dict[str, Any], errors: list[InitErrorDetails], notes: list[str]) -> dict[str, Any]:
    """Ludwig's ``hyperopt.executor.type: optuna`` (its trials one after another, each
    parameter suggested by an Optuna study) as raylight's ``search_alg: {type: optuna}``
    (Optuna's TPE sampler through Ray Tune's OptunaSearch, trials on the cluster); its
    ``sampler`` auto or tpe; its ``int`` space (Optuna's suggest_int, upper included) as
    ``randint`` (upper excluded, one more); ``pruner``, ``storage`` and ``study_name``
    ignored with a note each."""
    found, executor = _lookup(data, "hyperopt.executor")
    if not found or not isinstance(executor, dict) or executor.get("type") != "optuna":
        return data
    hyperopt = dict(data["hyperopt"])
    executor = {k: v for k, v in executor.items() if k != "type"}
    sampler = executor.pop("sampler", None)
    if sampler not in _OPTUNA_SAMPLERS:
        errors.append(_error(("hyperopt", "executor", "sampler"), "raylight's optuna search samples with TPE: use auto or tpe, or remove the key", sampler))
    search = hyperopt.get("search_alg") or {}
    if isinstance(search, dict) and search.get("type", "optuna") != "optuna":
        errors.append(_error(("hyperopt", "search_alg", "type"), "executor.type: optuna searches with Optuna: remove one of the two", search.get("type")))
    hyperopt["search_alg"] = {**(search if isinstance(search, dict) else {}), "type": "optuna"}
    for key, note in (
        ("pruner", "Ludwig's optuna trials report no intermediate values, so its pruner stops none; executor.scheduler stops trials early here"),
        ("storage", "raylight keeps the trials in the Ray Tune experiment under the output directory, not an Optuna database"),
        ("study_name", "raylight names the search by its output directory"),
    ):
        if key in executor:
            executor.pop(key)
            notes.append(f"hyperopt.executor.{key}: {note}")
    hyperopt["executor"] = executor
    params = hyperopt.get("parameters")
    if isinstance(params, dict):
        hyperopt["parameters"] = {
            k: {**v, "space": "randint", "upper": v["upper"] + 1}
            if isinstance(v, dict) and v.get("space") == "int" and isinstance(v.get("upper"), int) else v
            for k, v in params.items()
        }
    return {**data, "hyperopt": hyperopt}


def _dotted_metric(data: dict[str, Any], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """A hyperopt ``metric`` written as ``<split>.<output>.<metric>`` (Ludwig's example of
    its optuna executor: ``validation.combined.loss``) as ``split``, ``output_feature`` and
    ``metric``; a ``split`` or ``output_feature`` given too must agree."""
    found, metric = _lookup(data, "hyperopt.metric")
    if not found or not isinstance(metric, str) or metric.count(".") != 2:
        return data
    split, output, name = metric.split(".")
    if split not in ("training", "validation", "test"):
        return data
    hyperopt = dict(data["hyperopt"])
    for key, value in (("split", split), ("output_feature", output)):
        if hyperopt.get(key, value) != value:
            fix = f"says {key} {value!r}, but hyperopt.{key} is {hyperopt[key]!r}: make them agree, or give metric: {name}"
            errors.append(_error(("hyperopt", "metric"), fix, metric))
            return data
    return {**data, "hyperopt": {**hyperopt, "split": split, "output_feature": output, "metric": name}}


def _combiner_type(data: dict[str, Any], combiners: tuple[str, ...], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """``data`` without a combiner section whose type raylight lacks, that a problem listing
    the types it has (the section's other keys are that type's: not reported one by one)."""
    combiner = data.get("combiner")
    kind = combiner.get("type", combiners[0]) if isinstance(combiner, dict) else combiners[0]
    if kind in combiners or not isinstance(kind, str):
        return data
    which = "Ludwig's" if kind in LUDWIG_COMBINERS else "the"
    fix = (
        f"{which} {kind} combiner is not available; raylight's combiners: {', '.join(combiners)}; use one and "
        "remove the combiner's other keys (concat: fully connected layers over the concatenated inputs; "
        "fc_layers, norm, residual)"
    )
    if kind in LUDWIG_COMBINERS:
        fix += "; Ludwig 0.17 may choose this combiner for a config that names none (ludwig render_config shows which)"
    else:
        close = difflib.get_close_matches(kind, combiners, n=1)
        fix += f"; did you mean {close[0]!r}?" if close else ""
    errors.append(_error(("combiner", "type"), fix, kind))
    return _without(data, "combiner")


def _optimizer_lr(data: dict[str, Any], errors: list[InitErrorDetails]) -> dict[str, Any]:
    """``trainer.optimizer.lr`` (torch's name, in Ludwig's examples; Ludwig 0.17's schema
    drops it) as ``trainer.learning_rate``; both, at different values, is a problem."""
    found, lr = _lookup(data, "trainer.optimizer.lr")
    if not found:
        return data
    data = _without(data, "trainer.optimizer.lr")
    trainer = data["trainer"]
    if trainer.get("learning_rate", lr) != lr:
        fix = f"the learning rate, which trainer.learning_rate gives too ({trainer['learning_rate']!r}); keep one"
        errors.append(_error(("trainer", "optimizer", "lr"), fix, lr))
        return data
    return {**data, "trainer": {**trainer, "learning_rate": lr}}


def _fc_layers(section: Any, loc: tuple[Any, ...], errors: list[InitErrorDetails]) -> Any:
    """``section`` with FC_LAYER_KEYS applied to each entry of its ``fc_layers``."""
    if not isinstance(section, dict) or not isinstance(section.get("fc_layers"), list):
        return section
    layers = [
        _apply(layer, FC_LAYER_KEYS, (*loc, "fc_layers", i), errors) if isinstance(layer, dict) else layer
        for i, layer in enumerate(section["fc_layers"])
    ]
    return {**section, "fc_layers": layers}


_error = value_error

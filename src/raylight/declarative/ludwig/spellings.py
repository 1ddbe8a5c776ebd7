"""Ludwig's spellings of settings raylight has, translated to raylight's: the strategy as
``{type: ...}`` and DeepSpeed's JSON sections, a ``validation_metric`` given without its
output, and the hyperparameter search's key paths (a feature's name first, an output's
``loss.weight``, the combiner's ``num_fc_layers`` / ``output_size``, the feature-level
``defaults.<type>.<section>.<key>``). The schema (``raylight.declarative.config``) calls
these; they read and return plain data."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from raylight.config.schema import check_strategy_name
from raylight.declarative.features import FEATURES
from raylight.declarative.metrics import metric_name, metrics_measured
from raylight.declarative.outputs import OUTPUTS


# -- backend.trainer.strategy ---------------------------------------------------------
def strategy_from_ludwig(value: Any) -> Any:
    """``backend.trainer.strategy`` in raylight's terms: Ludwig names the strategy of a
    mapping with ``type:`` (``{type: fsdp}``), raylight's options models with ``name:``;
    a mapping with no options is the name alone."""
    if not isinstance(value, dict) or "type" not in value:
        return check_strategy_name(value)
    if "name" in value:
        raise ValueError("give the strategy's name once: `type:` (Ludwig's spelling) or `name:`, not both")
    options = {k: v for k, v in value.items() if k != "type"}
    name = value["type"]
    check_strategy_name(name)
    if not options:
        return name
    if name == "deepspeed":
        options = _deepspeed_from_ludwig(options)
    return {"name": name, **options}


# Ludwig's DeepSpeedStrategy takes these DeepSpeed JSON sections as its options.
LUDWIG_DEEPSPEED_SECTIONS = ("zero_optimization", "fp16", "bf16", "compression_training")


def _deepspeed_from_ludwig(options: dict[str, Any]) -> dict[str, Any]:
    """Ludwig's ``{type: deepspeed, zero_optimization: {...}, fp16: {...}}`` as
    ``raylight.DeepSpeed`` options: its DeepSpeed JSON sections become ``config``. A ZeRO
    value Ludwig leaves ``auto`` (stage, offload devices) takes raylight's default
    (stage 2, no offload): Ludwig resolves those from the model it trains."""
    sections = {k: options.pop(k) for k in LUDWIG_DEEPSPEED_SECTIONS if k in options}
    if not sections:
        return options
    given = options.get("config")
    if given is not None and not isinstance(given, dict):
        raise ValueError(
            f"give the DeepSpeed JSON one way: {sorted(sections)} (Ludwig's spelling) or "
            "config: a path, not both"
        )
    zero = sections.get("zero_optimization")
    if isinstance(zero, dict):
        zero = {k: v for k, v in zero.items() if v != "auto"}
        for part in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(part), dict) and zero[part].get("device") == "auto":
                del zero[part]
        sections["zero_optimization"] = zero
    clash = sorted(set(sections) & set(given or {}))
    if clash:
        raise ValueError(f"{clash} given both as strategy options and inside config; give them once")
    return {**options, "config": {**(given or {}), **sections}}


# -- trainer.validation_field ----------------------------------------------------------
def inferred_validation_field(data: Any) -> Any:
    """Ludwig's rule for a model of several outputs whose ``trainer.validation_metric`` (not
    the loss) comes without a ``validation_field``: the field is the one output that
    measures that metric; two or more is an error that names them."""
    trainer, outputs = (data.get("trainer"), data.get("output_features")) if isinstance(data, dict) else (None, None)
    if not isinstance(trainer, dict) or not isinstance(outputs, list) or len(outputs) < 2:
        return data
    metric = trainer.get("validation_metric")
    if trainer.get("validation_field") is not None or not isinstance(metric, str) or metric_name(metric) == "loss":
        return data
    owners = [
        out["name"] for out in outputs
        if isinstance(out, dict) and out.get("type") in OUTPUTS
        and metric_name(metric) in metrics_measured(out["type"], "validation")
    ]
    if len(owners) > 1:
        raise ValueError(
            f"trainer.validation_metric: {metric!r} is measured on the outputs {owners}; set "
            "trainer.validation_field to the one it follows"
        )
    return {**data, "trainer": {**trainer, "validation_field": owners[0]}} if owners else data


# -- hyperopt parameters ---------------------------------------------------------------
# Ludwig's searchable spellings of the combiner's layers (its hyperopt examples tune them).
LUDWIG_LAYER_KEYS = ("combiner.num_fc_layers", "combiner.output_size")
# Ludwig's feature-level hyperopt parameters, defaults.<type>.<section>.<key>: the side
# each section is set on.
FEATURE_LEVEL = {"preprocessing": "input_features", "encoder": "input_features", "decoder": "output_features", "loss": "output_features"}


def feature_paths(data: dict[str, Any]) -> dict[str, str]:
    """Each feature's name -> its path (``input_features.<i>`` / ``output_features.<i>``):
    Ludwig's hyperopt parameters start with a feature's name."""
    return {
        feat["name"]: f"{section}.{i}"
        for section in ("input_features", "output_features")
        for i, feat in enumerate(data.get(section) or [])
        if isinstance(feat, dict) and isinstance(feat.get("name"), str)
    }


def raylight_key(data: dict[str, Any], key: str, features: Mapping[str, str]) -> str:
    """``key`` in raylight's spelling: one starting with a feature's name (``review.encoder.type``,
    ``features``: ``feature_paths``) as that feature's path, unless a config section has the
    name; an output's ``loss.weight`` as its ``loss_weight``."""
    head, _, rest = key.partition(".")
    if head not in data and head in features and rest:
        key = f"{features[head]}.{rest}"
    parts = key.split(".")
    if len(parts) == 4 and parts[0] == "output_features" and parts[2:] == ["loss", "weight"]:
        parts[2:] = ["loss_weight"]  # Ludwig's loss.weight
        key = ".".join(parts)
    return key


def combiner_layers(data: dict[str, Any], key: str, value: Any) -> dict[str, Any] | None:
    """A copy of ``data`` with Ludwig's ``combiner.num_fc_layers`` (copies of the first of
    ``combiner.fc_layers``, or of 256 units) or ``combiner.output_size`` (every layer's
    size) set to ``value``; None when ``key`` is neither."""
    if key not in LUDWIG_LAYER_KEYS or not isinstance(data.get("combiner"), dict):
        return None
    out = copy.deepcopy(data)
    layers = list(out["combiner"].get("fc_layers") or [])
    first = dict(layers[0]) if layers else {"output_size": 256}
    if key.endswith("num_fc_layers"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KeyError(f"combiner.num_fc_layers takes a whole number of layers from 0, got {value!r}")
        out["combiner"]["fc_layers"] = [dict(first) for _ in range(value)]
    else:
        out["combiner"]["fc_layers"] = [{**layer, "output_size": value} for layer in layers]
    return out


def feature_level_paths(data: dict[str, Any], key: str, own: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Ludwig's feature-level hyperopt parameter ``defaults.<type>.<section>.<key>``, as
    Ludwig applies it (its value goes into the ``defaults`` section, which fills in what
    each feature leaves out): ``<section>.<key>`` on each input (``preprocessing``,
    ``encoder``) or output (``decoder``, ``loss``) feature of that type, but those that
    set it themselves, and, for an encoder's or decoder's settings, those that name a
    ``type`` of their own other than the defaults' ("the default encoder"). KeyError when
    it reaches no feature. The paths (``<side>.<i>.<section>.<key>``) the parameter sets."""
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
    paths = []
    for i in of_kind:
        mine = own.get(f"{side}.{i}", {})
        if f"{section}.{setting}" in mine:
            continue  # the feature's own setting wins over its defaults
        if setting != "type" and f"{section}.type" in mine and mine[f"{section}.type"] != default_type:
            continue  # not the default encoder (decoder)
        paths.append(f"{side}.{i}.{section}.{setting}")
    if not paths:
        raise KeyError(
            f"every {kind} {side.removesuffix('_features')} feature sets {section}.{setting} itself, or names "
            f"another {section} type than the defaults', so the parameter would change nothing; "
            f"search <feature name>.{section}.{setting} instead"
        )
    return paths


def _builtin_encoder_type(kind: str) -> Any:
    """The encoder type a ``kind`` input feature has when nothing names one."""
    try:
        feature = FEATURES[kind].Input.model_validate({"name": "x", "type": kind})
    except (KeyError, ValidationError):
        return None
    return getattr(getattr(feature, "encoder", None), "type", None)


# -- an image's stacked_cnn in Ludwig's older names -------------------------------------
# The names Ludwig's own examples (examples/mnist/, the open-set ones) still write for a
# conv layer's settings, Ludwig's TensorFlow-era names, and Ludwig 0.17's (torch's) for them.
OLD_CONV_NAMES = {"num_filters": "out_channels", "filter_size": "kernel_size", "pool_size": "pool_kernel_size"}
# The image encoders that train from scratch always, so take no use_pretrained key.
_NO_WEIGHTS = ("stacked_cnn", "mlp_mixer")


def _renamed(section: dict[str, Any]) -> dict[str, Any]:
    """``section`` with OLD_CONV_NAMES's old names as the new ones, where it lacks the new;
    both given stays as written (the old one is then told as an unknown key)."""
    out = dict(section)
    for old, new in OLD_CONV_NAMES.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


# An image encoder's size keys in Ludwig's spelling before 0.6 (its insurance_lite example's
# vit: img_height, img_width, in_channels beside the encoder): the image's size and
# channels, which Ludwig 0.17 takes from preprocessing.
_IMAGE_SIZE_KEYS = {"img_height": "height", "img_width": "width", "in_channels": "num_channels"}


def _image_size_keys(feature: dict[str, Any], encoder: dict[str, Any]) -> dict[str, Any]:
    """``encoder`` without its ``img_height``/``img_width``/``in_channels`` where the
    feature's preprocessing says the same (height, width, num_channels) or nothing; one that
    disagrees stays (an unknown key, reported with the rest)."""
    prep = feature.get("preprocessing")
    prep = prep if isinstance(prep, dict) else {}
    return {
        k: v for k, v in encoder.items()
        if not (k in _IMAGE_SIZE_KEYS and prep.get(_IMAGE_SIZE_KEYS[k], v) == v)
    }


def image_encoder_from_ludwig(feature: dict[str, Any]) -> dict[str, Any]:
    """``feature`` (an input) with an image stacked_cnn's older names as Ludwig 0.17's (in
    each of its ``conv_layers``; the encoder's own keys are Ludwig 0.17's), and without a ``use_pretrained: false``
    on an encoder that has no pre-trained weights (stacked_cnn, mlp_mixer: from scratch,
    as the key asks)."""
    encoder = feature.get("encoder")
    if feature.get("type") != "image" or not isinstance(encoder, dict):
        return feature
    kind = encoder.get("type", "stacked_cnn")
    if kind in _NO_WEIGHTS and encoder.get("use_pretrained", True) is False:
        encoder = {k: v for k, v in encoder.items() if k != "use_pretrained"}
    encoder = _image_size_keys(feature, encoder)
    if kind == "stacked_cnn" and isinstance(encoder.get("conv_layers"), list):
        layers = [_renamed(layer) if isinstance(layer, dict) else layer for layer in encoder["conv_layers"]]
        encoder = {**encoder, "conv_layers": layers}
    return {**feature, "encoder": encoder}

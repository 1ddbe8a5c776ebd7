"""The declarative model config (Ludwig-style), ``ModelConfig``: its sections, and the
checks across them (outputs and metrics, balancing, strategy, the hyperopt section).

YAML is only a serialisation of these models. Unknown keys and bad values are errors
naming the key path and the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, to_jsonable_python

from raylight.config.base import ConfigModel
from raylight.config.loggers import LoggerSetting, parse_loggers
from raylight.declarative.combiners import COMBINERS, CombinerSection
from raylight.declarative.combiners.concat import ConcatCombiner
from raylight.declarative.config.backend import BackendConfig
from raylight.declarative.config.features import InputFeature, OutputFeature
from raylight.declarative.config.hyperopt import HyperoptConfig
from raylight.declarative.config.parameters import check_parameter, space_values
from raylight.declarative.config.preprocessing import PreprocessingSection
from raylight.declarative.config.trainer import TrainerSection
from raylight.declarative.ludwig.check import check_ludwig_keys, own_settings, say_ignored
from raylight.declarative.ludwig.errors import joined, value_error
from raylight.declarative.ludwig.spellings import inferred_validation_field
from raylight.declarative.metrics import COMBINED, field_metrics

# The concat combiner's model, by the name it had before the combiners were a family.
CombinerConfig = ConcatCombiner

# Ludwig 0.17 (ludwig/schema/model_types/base.py, ModelConfig.from_dict): with no combiner
# section, an ECD model of this many inputs or more gets ft_transformer, fewer concat.
FT_TRANSFORMER_FROM_INPUTS = 3

# The combiner types raylight has (a Ludwig one it lacks is refused with these).
COMBINER_TYPES: tuple[str, ...] = tuple(COMBINERS)

# At most this many preprocessings of the dataset for one search (hyperopt.preprocessing_variants).
MAX_PREPROCESSINGS = 8
_OWN: ContextVar[dict[str, dict[str, Any]] | None] = ContextVar("raylight_own_settings", default=None)


def _fields(kinds: Mapping[str, str]) -> str:
    """What a validation_field or hyperopt output_feature may be, for messages."""
    return ", ".join(repr(name) for name in kinds) + f" or {COMBINED}"


def _of(kinds: Mapping[str, str], field: str) -> str:
    """The output ``field`` names, for messages: "of a binary output", ..."""
    if len(kinds) == 1:
        return f"of a {next(iter(kinds.values()))} output"
    if field == COMBINED:
        return "of the combined outputs (their weighted losses added up; name an output for its other metrics)"
    return f"of output {field!r} ({kinds[field]})"


class ModelConfig(ConfigModel):
    input_features: list[InputFeature] = Field(min_length=1, description="Model inputs.")
    output_features: list[OutputFeature] = Field(
        min_length=1, max_length=64,
        description="The targets: one, or several trained together (Ludwig's multi-task model: the outputs share "
        "the encoders and combiner, and training adds up their losses, each times its loss_weight).",
    )
    combiner: CombinerSection = Field(
        default_factory=lambda: ConcatCombiner(),
        description="How the encoded inputs are combined: one of Ludwig's combiner types (with no section, as in "
        f"Ludwig 0.17: ft_transformer for {FT_TRANSFORMER_FROM_INPUTS} or more inputs, else concat; "
        "raylight.declarative.combiners, docs/declarative.md).",
    )
    trainer: TrainerSection = Field(default_factory=lambda: TrainerSection(), description="Training.")
    preprocessing: PreprocessingSection = Field(
        default_factory=lambda: PreprocessingSection(), description="Dataset-level preprocessing."
    )
    backend: BackendConfig = Field(default_factory=lambda: BackendConfig(), description="Where it runs.")
    hyperopt: HyperoptConfig | None = Field(
        None, description="Hyperparameter search run by `raylight hyperopt`; ignored by `raylight train`."
    )
    loggers: list[LoggerSetting] = Field(
        default_factory=list,
        description="Experiment loggers the training run writes to: tensorboard, mlflow, wandb, "
        "each a name or a mapping with a type and its options (RunConfig.loggers; docs/loggers.md).",
    )

    _parse_loggers = field_validator("loggers", mode="before")(parse_loggers)

    @model_validator(mode="before")
    @classmethod
    def _default_combiner(cls, data: Any) -> Any:
        """Ludwig 0.17's default combiner: a config with no combiner section and at least
        FT_TRANSFORMER_FROM_INPUTS inputs gets ft_transformer, one with fewer concat (a
        section without a type is concat)."""
        if isinstance(data, dict) and "combiner" not in data:
            inputs = data.get("input_features")
            if isinstance(inputs, list) and len(inputs) >= FT_TRANSFORMER_FROM_INPUTS:
                return {**data, "combiner": {"type": "ft_transformer"}}
        return data

    # What the config as written set itself (``ludwig.own_settings``): the feature-level
    # hyperopt parameters (``set_path``'s ``defaults.<type>...``) leave it alone.
    _own: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    @field_validator("hyperopt")
    @classmethod
    def _check_hyperopt(cls, value: HyperoptConfig | None, info: ValidationInfo) -> HyperoptConfig | None:
        if value is None or not {"output_features", "preprocessing", "backend"} <= set(info.data):
            return value  # nothing to check, or earlier sections already failed
        base = to_jsonable_python(info.data)
        kinds = {out.name: out.type for out in info.data["output_features"]}
        if value.output_feature not in (COMBINED, *kinds):
            raise ValueError(f"output_feature {value.output_feature!r} is not an output feature; use {_fields(kinds)}")
        # trainer.evaluate_training_set measures the training split as the validation split
        evaluated = value.split == "training" and "trainer" in info.data and info.data["trainer"].evaluate_training_set
        allowed = field_metrics(kinds, value.output_feature, "validation" if evaluated else value.split)
        if value.metric not in allowed:
            more = "" if evaluated or value.split != "training" else " (trainer.evaluate_training_set: true measures the rest)"
            raise ValueError(
                f"metric {value.metric!r} is not measured on the {value.split} split {_of(kinds, value.output_feature)}; "
                f"allowed: {allowed}{more}"
            )
        if value.split == "validation" and info.data["preprocessing"].split.probabilities[1] == 0:
            raise ValueError("split is validation but preprocessing.split.probabilities gives it 0; give it a fraction or set split: training")
        t = info.data["backend"].trainer
        if t.min_workers is not None or t.max_workers is not None:
            raise ValueError("trials need a fixed size: set backend.trainer.num_workers, not min_workers/max_workers")
        preprocessed = [key for key, space in value.parameters.items() if check_parameter(base, key, space, _OWN.get() or {}, cls.model_validate)]
        if preprocessed and value.executor.scheduler.type == "pbt":
            raise ValueError(
                f"parameters {preprocessed} change preprocessing, which scheduler pbt cannot mutate in a running "
                "trial (its data is preprocessed before it starts); search them with another scheduler"
            )
        variants = math.prod(len(space_values(value.parameters[key])) for key in preprocessed)
        if variants > MAX_PREPROCESSINGS:
            raise ValueError(
                f"parameters {preprocessed} change preprocessing in {variants} ways, each preprocessed and held "
                f"before the trials; search at most {MAX_PREPROCESSINGS} (fewer values, or one search per setting)"
            )
        value._outputs, value._preprocessed = list(kinds), preprocessed
        return value

    @model_validator(mode="after")
    def _check_balancing(self) -> ModelConfig:
        prep, output = self.preprocessing, self.output_features[0]
        key = "oversample_minority" if prep.oversample_minority is not None else "undersample_majority"
        if prep.balancing and len(self.output_features) > 1:
            raise ValueError(
                f"preprocessing.{key}: balances the two classes of a model's one binary output, but this "
                f"model has {len(self.output_features)} outputs; remove the key"
            )
        if prep.balancing and output.type != "binary":
            raise ValueError(
                f"preprocessing.{key}: balances a binary output's two classes, but output "
                f"{output.name!r} is {output.type}; remove the key"
            )
        return self

    @model_validator(mode="after")
    def _check_loss_balancing(self) -> ModelConfig:
        t, strategy = self.trainer, self.backend.trainer.strategy
        pref, n = t.loss_balancing_preference_vector, len(self.output_features)
        if pref is not None and (len(pref) != n or sum(pref) <= 0):
            raise ValueError(
                f"trainer.loss_balancing_preference_vector: one non-negative entry per output ({n}), not all 0; got {pref}"
            )
        name = strategy if isinstance(strategy, str) else strategy.name
        special = {"muon", "schedule_free_adamw", "lbfgs"} & {t.optimizer.type}
        if name != "ddp" and (special or t.loss_balancing in ("uncertainty", "famo", "nash_mtl")):
            which = f"trainer.optimizer.type: {t.optimizer.type}" if special else f"trainer.loss_balancing: {t.loss_balancing}"
            raise ValueError(f"{which} runs with backend.trainer.strategy ddp (the default) only; remove the strategy or use another")
        return self

    @model_validator(mode="after")
    def _check_mixed_precision(self) -> ModelConfig:
        if self.trainer.use_mixed_precision and self.backend.trainer.use_gpu:
            raise ValueError(
                "trainer.use_mixed_precision: mixed precision on GPUs is not available on the declarative "
                "path yet; set it false (the workers train in full precision)"
            )
        return self

    @model_validator(mode="after")
    def _check_regularization(self) -> ModelConfig:
        t = self.trainer
        strategy = self.backend.trainer.strategy
        name = strategy if isinstance(strategy, str) else strategy.name
        if t.regularization_lambda > 0 and t.regularization_type is not None and name == "fsdp":
            raise ValueError(
                "trainer.regularization_lambda: not with backend.trainer.strategy fsdp (its parameters "
                "are shards); use trainer.optimizer.weight_decay, or strategy ddp or deepspeed"
            )
        return self

    @model_validator(mode="after")
    def _check_validation_metric(self) -> ModelConfig:
        t = self.trainer
        kinds = {out.name: out.type for out in self.output_features}
        if t.validation_field not in (COMBINED, *kinds):
            raise ValueError(f"trainer.validation_field: {t.validation_field!r} is not an output feature; use {_fields(kinds)}")
        has_validation = self.preprocessing.split.probabilities[1] > 0
        allowed = field_metrics(kinds, t.validation_field, "validation" if has_validation else "training")
        if t.validation_metric not in allowed:
            where = _of(kinds, t.validation_field) if has_validation else (
                "without a validation split (preprocessing.split.probabilities gives it 0: early "
                "stopping follows the training loss)"
            )
            raise ValueError(f"trainer.validation_metric: {t.validation_metric!r} is not measured {where}; allowed: {allowed}")
        return self

    @model_validator(mode="after")
    def _check_plateau(self) -> ModelConfig:
        sched = self.trainer.learning_rate_scheduler
        if sched is None or sched.reduce_on_plateau == 0:
            return self
        kinds, field, split = {out.name: out.type for out in self.output_features}, self.trainer.validation_field, sched.reduce_eval_split
        allowed = field_metrics(kinds, field, split)
        if sched.reduce_eval_metric not in allowed:
            raise ValueError(
                f"trainer.learning_rate_scheduler.reduce_eval_metric: {sched.reduce_eval_metric!r} is not "
                f"measured on the {split} split {_of(kinds, field)}; allowed: {allowed}"
            )
        if split == "validation" and self.preprocessing.split.probabilities[1] == 0:
            raise ValueError(
                "trainer.learning_rate_scheduler.reduce_eval_split is validation but "
                "preprocessing.split.probabilities gives it 0; give it a fraction or use training"
            )
        return self

    @model_validator(mode="after")
    def _check_combiner(self) -> ModelConfig:
        check = getattr(self.combiner, "check_inputs", None)
        problem = check(self.input_features) if check is not None else None
        if problem is not None:  # (the combiner's key, or None for the section; the message)
            key, message = problem
            loc = ("combiner",) if key is None else ("combiner", key)
            raise ValidationError.from_exception_data(
                "ModelConfig", [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)]
            )
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> ModelConfig:
        names = [f.name for f in (*self.input_features, *self.output_features)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"feature names must be unique; repeated: {dupes}")
        return self

    @model_validator(mode="after")
    def _check_strategy(self) -> ModelConfig:
        if getattr(self.backend.trainer.strategy, "stage", None) == 3:
            # The declarative loop checkpoints raw state dicts; ZeRO-3's are placeholders.
            raise ValueError(
                "backend.trainer.strategy: deepspeed stage 3 is not available in declarative "
                "configs (their checkpoints are state dicts, which ZeRO-3 partitions away); use "
                "stage 1 or 2, or strategy: fsdp"
            )
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: ModelWrapValidatorHandler[ModelConfig]) -> ModelConfig:
        """Ludwig's keys first (``ludwig.check``: those raylight takes as they are, moves,
        ignores or refuses), then the output a validation_metric given alone follows, then
        the rest; every problem of the config in one error, at Ludwig's key paths. Defined
        last, so it wraps the checks across sections too. The Ludwig keys ignored are said
        once a config loads (not again for the trials' configs its hyperopt section checks).
        What the config as written set itself is remembered (``own_settings``)."""
        if isinstance(data, ModelConfig):
            return handler(data)
        own = own_settings(data)
        outermost = _OWN.get() is None  # not a trial's config checked inside a config's own validation
        data, problems, ignored = check_ludwig_keys(data, COMBINER_TYPES)
        try:
            data = inferred_validation_field(data)
        except ValueError as exc:
            problems.append(value_error(("trainer", "validation_field"), str(exc).removeprefix("trainer.validation_metric: "), None))
        token = _OWN.set(own)  # for _check_hyperopt, which runs inside the handler
        try:
            config = handler(data)
        except ValidationError as err:
            raise joined(cls.__name__, problems, err, data) from None
        finally:
            _OWN.reset(token)
        if problems:
            raise joined(cls.__name__, problems, None, data)
        if outermost:
            say_ignored(ignored)
        config._own = own
        return config

"""The declarative model config (Ludwig-style): features, combiner, trainer, backend.

YAML is only a serialisation of these models. Unknown keys and bad values are errors
naming the key path and the allowed values. Each input feature type's section is its
module's model in ``raylight.declarative.features``.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PlainValidator,
    PrivateAttr,
    SerializeAsAny,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import to_jsonable_python

from raylight.config.base import ConfigModel
from raylight.config.loggers import LoggerSetting, parse_loggers
from raylight.config.schema import (
    MAX_WORKERS,
    AdaptiveConfig,
    StrategySetting,
    check_resources,
    check_strategy_name,
)
from raylight.declarative.features import FEATURES
from raylight.declarative.features.base import MAX_WIDTH, FeatureModel
from raylight.declarative.hyperopt_config import HyperoptConfig
from raylight.declarative.keypath import KeyPathError, assign
from raylight.declarative.layers import FCLayer, FCStackConfig
from raylight.declarative.ludwig import check_ludwig_keys, own_settings
from raylight.declarative.metrics import COMBINED, field_metrics, metric_name, metrics_measured

# Upper bounds: far beyond any real use, low enough that a typo fails here and not as an
# allocation of terabytes or a loop of years.
MAX_EPOCHS = 1_000_000
MAX_BATCH = 2**24
MAX_SEED = 2**32 - 1  # what numpy's and torch's generators take


# -- features ------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _feature_union(models: tuple[type[FeatureModel], ...]) -> TypeAdapter[Any]:
    union = functools.reduce(operator.or_, models)  # a union built at run time: no static type
    return TypeAdapter(Annotated[union, Field(discriminator="type")])  # type: ignore[arg-type]


def _input_feature(value: Any) -> FeatureModel:
    """``value`` as the model of the type it names, one of FEATURES as they are now (so a
    type added to FEATURES is accepted). Errors keep pydantic's tagged-union key paths
    (``input_features.0.number.name``) and list the types in FEATURES' order."""
    validated: FeatureModel = _feature_union(tuple(f.Input for f in FEATURES.values())).validate_python(value)
    return validated


# Serialised as the type's model, not as the FeatureModel base.
InputFeature = Annotated[SerializeAsAny[FeatureModel], PlainValidator(_input_feature)]


OutputType = Literal["binary", "category", "number", "set", "vector"]
OUTPUT_TYPES: tuple[str, ...] = get_args(OutputType)


class OutputFeature(FeatureModel):
    type: OutputType = Field(description="Target type; sets loss and metrics.")
    loss_weight: float = Field(
        1.0, gt=0, le=1e6,
        description="Multiplies this output's loss in training (Ludwig's loss.weight); the reported losses are unweighted.",
    )
    threshold: float = Field(
        0.5, gt=0, lt=1,
        description="binary, set: predict true (a label) at this probability and above (Ludwig's); accuracy and "
        "jaccard count those predictions, roc_auc does not depend on it.",
    )

    vector_size: int | None = Field(
        None, ge=1, le=MAX_WIDTH,
        description="vector: the floats in each row (Ludwig's); null: the length the training rows share.",
    )
    top_k: int = Field(
        3, ge=1, le=MAX_WIDTH,
        description="category: hits_at_k counts a row right when its class is among the k most likely (Ludwig's).",
    )

    @model_validator(mode="after")
    def _threshold_of_a_classifier(self) -> OutputFeature:
        if self.threshold != 0.5 and self.type not in ("binary", "set"):
            raise ValueError(f"threshold: a binary or set output's setting; a {self.type} output has none; remove it")
        if self.vector_size is not None and self.type != "vector":
            raise ValueError(f"vector_size: a vector output's setting; a {self.type} output has none; remove it")
        if self.top_k != 3 and self.type != "category":
            raise ValueError(f"top_k: a category output's setting; a {self.type} output has none; remove it")
        return self


# -- model and training ----------------------------------------------------------------
class CombinerConfig(FCStackConfig):
    """Ludwig's concat combiner: the encoded inputs concatenated, then fully connected
    layers (each: linear, normalisation, activation, dropout), in Ludwig's order."""

    type: Literal["concat"] = Field("concat", description="How encoded inputs are combined.")
    fc_layers: list[FCLayer] = Field(
        default_factory=lambda: [FCLayer(output_size=64)], max_length=64, description="Layers after concatenation."
    )


OptimizerType = Literal["adam", "adamw", "sgd", "adadelta", "adagrad", "adamax", "nadam", "rmsprop"]

# Each optimizer's own settings (Ludwig's names, which are torch's): a setting given for
# another type is an error. Unset (null), a setting takes torch's default, but for SGD's
# momentum, raylight's 0.9.
OPTIMIZER_SETTINGS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "dampening", "nesterov"),
    "adam": ("betas", "eps", "amsgrad"),
    "adamw": ("betas", "eps", "amsgrad"),
    "adadelta": ("rho", "eps"),
    "adagrad": ("initial_accumulator_value", "lr_decay", "eps"),
    "adamax": ("betas", "eps"),
    "nadam": ("betas", "eps", "momentum_decay"),
    "rmsprop": ("momentum", "alpha", "eps", "centered"),
}
SGD_MOMENTUM = 0.9


class OptimizerConfig(ConfigModel):
    type: OptimizerType = Field("adam", description="Optimizer: torch.optim's class of that name (Ludwig's types).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="Weight decay (every type).")
    momentum: float | None = Field(None, ge=0, lt=1, description="sgd (null: 0.9), rmsprop (null: 0).")
    dampening: float | None = Field(None, ge=0, le=1, description="sgd: momentum dampening (null: 0).")
    nesterov: bool | None = Field(None, description="sgd: Nesterov momentum (null: false); needs momentum > 0 and dampening 0.")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] | None = Field(
        None, description="adam, adamw, adamax, nadam: the moving averages' coefficients (null: [0.9, 0.999])."
    )
    eps: float | None = Field(None, gt=0, le=1, description="Added to denominators (null: torch's default for the type).")
    amsgrad: bool | None = Field(None, description="adam, adamw: the AMSGrad variant (null: false).")
    rho: float | None = Field(None, ge=0, le=1, description="adadelta: the squared gradients' average coefficient (null: 0.9).")
    initial_accumulator_value: float | None = Field(None, ge=0, description="adagrad (null: 0).")
    lr_decay: float | None = Field(None, ge=0, le=1, description="adagrad: learning rate decay (null: 0).")
    momentum_decay: float | None = Field(None, ge=0, description="nadam (null: 0.004).")
    alpha: float | None = Field(None, ge=0, le=1, description="rmsprop: smoothing constant (null: 0.99).")
    centered: bool | None = Field(None, description="rmsprop: normalise by the gradient's variance estimate (null: false).")

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> OptimizerConfig:
        own = OPTIMIZER_SETTINGS[self.type]
        for name in sorted({n for names in OPTIMIZER_SETTINGS.values() for n in names} - set(own)):
            if getattr(self, name) is not None:
                takers = [t for t, names in OPTIMIZER_SETTINGS.items() if name in names]
                raise ValueError(f"{name} is a setting of {', '.join(takers)}, not of {self.type}; remove it")
        if self.nesterov and (self.kwargs()["momentum"] <= 0 or (self.dampening or 0) != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening 0")
        return self

    def kwargs(self) -> dict[str, Any]:
        """The optimizer's keyword arguments beside the learning rate."""
        out: dict[str, Any] = {"weight_decay": self.weight_decay}
        for name in OPTIMIZER_SETTINGS[self.type]:
            if (value := getattr(self, name)) is not None:
                out[name] = value
        if self.type == "sgd":
            out.setdefault("momentum", SGD_MOMENTUM)
        return out


class GradientClippingConfig(ConfigModel):
    clipglobalnorm: float | None = Field(
        None,
        gt=0,
        description=(
            "Clip each optimizer step's gradient (averaged over the workers and the step's "
            "accumulated micro-steps) to this total norm; null: no clipping (Ludwig's default is 0.5)."
        ),
    )
    clipnorm: float | None = Field(None, description="Ludwig's; raylight takes clipglobalnorm only: null.")
    clipvalue: float | None = Field(None, description="Ludwig's; raylight takes clipglobalnorm only: null.")

    @field_validator("clipnorm", "clipvalue")
    @classmethod
    def _only_the_global_norm(cls, value: float | None) -> None:
        if value is not None:
            raise ValueError(
                f"raylight clips by the gradient's total norm only: set clipglobalnorm: {value:g} "
                "instead, and remove this key (or set it to null)"
            )
        return None


Decay = Literal["linear", "exponential", "cosine", "one_cycle", "inverse_sqrt", "polynomial", "wsd"]


class LRSchedulerConfig(ConfigModel):
    """Ludwig's ``trainer.learning_rate_scheduler``: its keys, defaults and meanings
    (raylight.declarative.lr_schedule computes the rates)."""

    decay: Decay | None = Field(
        None,
        description="The decay after the warm-up: linear (to 0 at the last step), exponential "
        "(lr * decay_rate ** (1 + step / decay_steps)), cosine (annealing to eta_min, restarting "
        "every t_0 steps), one_cycle (torch's OneCycleLR: its own warm-up to max_lr over "
        "pct_start of the run, then down), inverse_sqrt (lr / sqrt(max(step, "
        "inverse_sqrt_warmup_steps))), polynomial (to polynomial_end_lr), wsd (warm-up, stable, "
        "cosine decay); null: none.",
    )
    decay_rate: float = Field(0.96, ge=0, le=1, description="exponential: the factor per decay_steps steps.")
    decay_steps: int = Field(10000, ge=1, description="exponential: steps per decay_rate factor.")
    staircase: bool = Field(False, description="exponential: decay in whole decay_steps, not smoothly.")
    warmup_evaluations: float = Field(
        0, ge=0, description="Warm the rate up linearly from 0 over this many evaluations (epochs in raylight)."
    )
    warmup_fraction: float = Field(
        0.0, ge=0, le=1, description="Warm up over this fraction of the run's steps (the larger of the two warm-ups wins)."
    )
    reduce_on_plateau: int = Field(
        0, ge=0, description="At most this many times, multiply the rate by reduce_on_plateau_rate when reduce_eval_metric stops improving."
    )
    reduce_on_plateau_patience: int = Field(
        10, ge=0, description="Evaluations (epochs) without improvement before a reduction."
    )
    reduce_on_plateau_rate: float = Field(0.1, ge=0, le=1, description="The factor of each reduction.")
    reduce_eval_metric: str = Field("loss", description="The metric a plateau is judged on (as trainer.validation_metric).")
    reduce_eval_split: Literal["training", "validation"] = Field(
        "training", description="The split reduce_eval_metric is measured on."
    )
    t_0: int | None = Field(None, ge=1, description="cosine: steps before the first restart; null: one epoch.")
    t_mult: int = Field(1, ge=1, description="cosine: each restart's period is t_mult times the last.")
    eta_min: float = Field(0.0, ge=0, le=1, description="cosine: the lowest rate.")
    max_lr: float | None = Field(None, gt=0, le=100, description="one_cycle: the peak rate; null: trainer.learning_rate.")
    pct_start: float = Field(0.3, ge=0, le=1, description="one_cycle: the fraction of the run spent rising.")
    div_factor: float = Field(25.0, gt=0, description="one_cycle: the first rate is max_lr / div_factor.")
    final_div_factor: float = Field(1e4, gt=0, description="one_cycle: the last rate is the first / final_div_factor.")
    inverse_sqrt_warmup_steps: int = Field(4000, ge=1, description="inverse_sqrt: the step the decay starts from.")
    polynomial_power: float = Field(1.0, gt=0, description="polynomial: the decay's power (1: linear).")
    polynomial_end_lr: float = Field(0.0, ge=0, le=1, description="polynomial: the last rate, as a fraction of the base rate.")
    wsd_warmup_fraction: float = Field(0.1, ge=0, le=1, description="wsd: the fraction of the run warming up.")
    wsd_stable_fraction: float = Field(0.8, ge=0, le=1, description="wsd: the fraction at the base rate.")
    wsd_decay_fraction: float = Field(0.1, ge=0, le=1, description="wsd: the fraction decaying (what the two others leave).")

    @field_validator("reduce_eval_split", mode="before")
    @classmethod
    def _no_test_split(cls, value: Any) -> Any:
        if value == "test":
            raise ValueError(
                "raylight evaluates the test split once, after training: use training or validation"
            )
        return value

    _metric_name = field_validator("reduce_eval_metric")(metric_name)

    @model_validator(mode="after")
    def _one_warm_up(self) -> LRSchedulerConfig:
        if self.decay in ("one_cycle", "wsd") and (self.warmup_fraction > 0 or self.warmup_evaluations > 0):
            own = "pct_start" if self.decay == "one_cycle" else "wsd_warmup_fraction"
            raise ValueError(
                f"decay: {self.decay} warms up itself ({own}); remove warmup_fraction and "
                "warmup_evaluations (Ludwig ignores them there)"
            )
        if self.wsd_warmup_fraction + self.wsd_stable_fraction > 1 + 1e-9:
            raise ValueError(
                f"wsd_warmup_fraction + wsd_stable_fraction is {self.wsd_warmup_fraction + self.wsd_stable_fraction:g}: "
                "they are fractions of one run and sum to at most 1"
            )
        return self


AUTO_BATCH_SIZE = 64  # trainer.batch_size: auto's first global batch (the adaptive engine chooses the next)


class TrainerSection(ConfigModel):
    epochs: int = Field(10, ge=1, le=MAX_EPOCHS, description="Passes over the training split.")
    train_steps: int | None = Field(
        None, ge=1, le=2**40,
        description="Ludwig's: train this many optimizer steps (of the first batch size) instead of "
        "epochs; the last epoch stops part way. null: epochs decides.",
    )
    batch_size: int | Literal["auto"] = Field(
        128, description=f"Global batch size, or 'auto': start at {AUTO_BATCH_SIZE} and let the adaptive engine choose."
    )
    learning_rate: float | Literal["auto"] = Field(
        "auto", description="Base LR, or 'auto': the optimizer's default in torch (adam 1e-3), but sgd's 0.05."
    )
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(), description="Optimizer.")
    early_stop: int = Field(5, ge=-1, le=MAX_EPOCHS, description="Stop after this many epochs without validation improvement; -1 never.")
    evaluate_training_set: bool = Field(
        False,
        description="Ludwig's: after each epoch, also evaluate the model on the whole training split and report "
        "train_<metric> (the validation split's metrics; train_loss stays the epoch's running mean). Costs a forward "
        "pass over the training split each epoch, on every worker.",
    )
    adaptive: AdaptiveConfig | None = Field(
        None, description="Adaptive engine settings; batch_size: auto turns it on with defaults."
    )
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed for model initialisation and data order (0 to 2**32 - 1).")
    gradient_clipping: GradientClippingConfig = Field(
        default_factory=lambda: GradientClippingConfig(), description="Gradient clipping (Ludwig's section)."
    )
    learning_rate_scheduler: LRSchedulerConfig | None = Field(
        None, description="Warm-up, decay and reductions on plateau of the learning rate (Ludwig's section); null: a constant rate."
    )
    regularization_lambda: float = Field(
        0.0, ge=0, le=1,
        description="Ludwig's: add this times the weights' penalty (regularization_type) to each step's "
        "loss; 0: none. (trainer.optimizer.weight_decay decays the weights in the optimizer instead.)",
    )
    regularization_type: Literal["l1", "l2", "l1_l2"] | None = Field(
        "l2", description="Ludwig's: the penalty, over every parameter: l1 (sum of |w|), l2 (sum of w^2), l1_l2 (both)."
    )
    use_mixed_precision: bool = Field(
        False,
        description="Ludwig's: mixed precision on GPUs. Workers on CPUs train in full precision, "
        "as Ludwig's do there (said in the log); with backend.trainer.use_gpu it is an error (not "
        "available on the declarative path yet).",
    )
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        le=2**31,
        description="Rows the model takes at once in an evaluation (Ludwig's key; null or 0: 65,536, "
        "or each Ray Data block; auto: the same). Memory only: the results are the same.",
    )

    @field_validator("eval_batch_size", mode="before")
    @classmethod
    def _default_eval_batch(cls, value: Any) -> Any:
        return None if value in (0, "auto") and not isinstance(value, bool) else value

    validation_metric: str = Field(
        "loss",
        description="The validation metric early stopping and the best model follow: loss or any other the "
        "output measures (accuracy, roc_auc, precision, recall, specificity, hits_at_k, mse, mae, r2, rmse, mape, rmspe, "
        "jaccard; Ludwig's mean_squared_error, mean_absolute_error, root_mean_squared_error, "
        "mean_absolute_percentage_error, root_mean_squared_percentage_error and accuracy_micro too). Without a "
        "validation split: the training loss.",
    )
    validation_field: str = Field(
        "combined", description="Ludwig's: the output validation_metric is measured on, by its name, or combined "
        "(with several outputs: their weighted losses added up, whose one metric is loss).",
    )

    _validation_metric_name = field_validator("validation_metric")(metric_name)

    @field_validator("validation_metric", "validation_field", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """null (as Ludwig's schema defaults write them) is the default."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @field_validator("batch_size")
    @classmethod
    def _check_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_BATCH:
            raise ValueError(f"must be between 1 and {MAX_BATCH} or 'auto', got {value}")
        return value

    @field_validator("learning_rate")
    @classmethod
    def _check_lr(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and not 0 < value <= 100:
            raise ValueError(f"must be > 0 and at most 100, or 'auto', got {value}")
        return value


DEFAULT_SPLIT, DEFAULT_SPLIT_COLUMN = (0.7, 0.1, 0.2), "split"


class SplitConfig(ConfigModel):
    type: Literal["random", "fixed", "stratify", "hash", "datetime"] = Field(
        "random",
        description="How rows are split into train/validation/test: random (probabilities); fixed "
        "(Ludwig's: column says, 0 train, 1 validation, 2 test); stratify (Ludwig's: probabilities "
        "within each value of column, so every split keeps its proportions); hash (Ludwig's: a "
        "hash of column's value picks the split with probabilities, so rows of one value, e.g. "
        "one user's, stay together, in every run and as the dataset grows); datetime (Ludwig's: "
        "the rows in order of column's dates, the earliest train, then validation, then test, by "
        "probabilities).",
    )
    probabilities: tuple[float, float, float] = Field(
        DEFAULT_SPLIT, description="random, stratify, hash, datetime: fractions for train, validation and test; they sum to 1."
    )
    column: str | None = Field(
        None,
        min_length=1,
        description="fixed: the column of each row's split (null: split); stratify: the column to "
        "stratify on; hash: the column whose values are hashed; datetime: the column of dates.",
    )

    @field_validator("probabilities")
    @classmethod
    def _check_sum(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(p < 0 for p in value) or abs(sum(value) - 1.0) > 1e-6 or value[0] == 0:
            raise ValueError(f"need three non-negative fractions summing to 1 with train > 0, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> SplitConfig:
        # by value, not by what was written: a rendered config (every default) loads again
        if self.type == "fixed" and self.probabilities != DEFAULT_SPLIT:
            raise ValueError("probabilities is a setting of types random, stratify, hash and datetime; a fixed split takes column")
        if self.type == "random" and self.column is not None:
            raise ValueError("column is a setting of types fixed, stratify, hash and datetime; a random split takes probabilities")
        if self.type == "stratify" and self.column is None:
            raise ValueError("stratify needs column: the column whose values every split keeps in proportion")
        if self.type == "hash" and self.column is None:
            raise ValueError("hash needs column: the column whose values decide each row's split (an id)")
        if self.type == "datetime" and self.column is None:
            raise ValueError("datetime needs column: the column of dates the rows are split in order of")
        return self

    @property
    def fixed_column(self) -> str | None:
        """The column a fixed split reads (None for the other types)."""
        return (self.column or DEFAULT_SPLIT_COLUMN) if self.type == "fixed" else None

    @property
    def row_column(self) -> str | None:
        """The column each row's split is a function of, by itself: a fixed or a hash split's
        (None for the random and stratified splits, which draw)."""
        return self.fixed_column if self.type == "fixed" else self.column if self.type == "hash" else None

    @property
    def coded_column(self) -> str | None:
        """The column that decides every row's split: a fixed or hash split's (row by row) or
        a datetime split's (by the order of all its dates); None for the splits that draw."""
        return self.column if self.type == "datetime" else self.row_column


class PreprocessingSection(ConfigModel):
    split: SplitConfig = Field(default_factory=lambda: SplitConfig(), description="Dataset split.")
    sample_ratio: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Train on this fraction of the dataset's rows, drawn at random (seeded by "
        "trainer.seed) before the split (Ludwig's key).",
    )
    sample_size: int | None = Field(
        None,
        ge=1,
        description="Train on at most this many of the dataset's rows, drawn at random before the "
        "split; not with sample_ratio < 1 (Ludwig's key).",
    )

    oversample_minority: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Binary output: draw the training split's minority class (with replacement) "
        "to this ratio of the majority's rows (Ludwig's key; 1: as many).",
    )
    undersample_majority: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Binary output: keep the training split's majority class down to the minority's "
        "rows / this ratio (Ludwig's key; 1: as many; never more than it has).",
    )

    @model_validator(mode="after")
    def _one_sample(self) -> PreprocessingSection:
        if self.sample_size is not None and self.sample_ratio < 1:
            raise ValueError("sample_size cannot be used with sample_ratio < 1; set one of them")
        if self.oversample_minority is not None and self.undersample_majority is not None:
            raise ValueError("oversample_minority and undersample_majority cannot both be set; set one of them")
        return self

    @property
    def balancing(self) -> bool:
        return self.oversample_minority is not None or self.undersample_majority is not None

    @property
    def sampling(self) -> bool:
        return self.sample_ratio < 1 or self.sample_size is not None

    def sampled(self, rows: int) -> int:
        """How many of a dataset's ``rows`` are trained on (split into train, validation and
        test): all of them unless sample_ratio or sample_size says fewer."""
        if self.sample_size is not None:
            return min(rows, self.sample_size)
        return rows if self.sample_ratio == 1 else round(rows * self.sample_ratio)


class ProcessorConfig(ConfigModel):
    type: Literal["auto", "pandas", "ray_data", "dask"] = Field(
        "auto",
        description="Where the ray backend preprocesses. auto: in the driver with pandas (as the "
        "local backend does) when the dataset's estimated in-memory size is at most "
        "in_memory_limit_mb, else on Ray Data; pandas or ray_data: always there; dask "
        "(Ludwig's name): ray_data. The local backend always uses pandas.",
    )
    in_memory_limit_mb: int | Literal["auto"] = Field(
        "auto",
        description="type auto: the largest estimated in-memory size (MB) of a dataset preprocessed "
        "in the driver; auto: a quarter of the memory available when the run starts.",
    )

    @field_validator("in_memory_limit_mb")
    @classmethod
    def _check_limit(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= 2**40:
            raise ValueError(f"must be between 0 and {2**40} MB or 'auto', got {value}")
        return value


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


# Restarts a declarative run allows by default: a worker lost to a flaky node or an OOM
# kill costs an epoch, not the run (the core's fit() keeps 0: a loop of one's own says).
DEFAULT_MAX_FAILURES = 3


class BackendTrainer(ConfigModel):
    strategy: StrategySetting = Field(
        "ddp",
        description="ddp: every worker holds the model; fsdp: sharded (PyTorch FSDP2); "
        "deepspeed: ZeRO stage 1 or 2 (extra deepspeed); horovod: Horovod's "
        "DistributedOptimizer (real Horovod where installed, else raylight.horovod; not with "
        "batch_size: auto, which trains adaptively). Or a mapping naming the strategy "
        "with `type:` (Ludwig's spelling) or `name:`, and its options, e.g. {type: fsdp, "
        "reshard_after_forward: false}, {type: ddp, shared_memory: false} or Ludwig's "
        "{type: deepspeed, zero_optimization: {stage: 2}}.",
    )
    num_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Workers; default: what the cluster's CPUs (or GPUs) allow.")
    use_gpu: bool = Field(False, description="One GPU per worker.")
    resources_per_worker: dict[str, float] | None = Field(None, description="Ray resources per worker.")
    min_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Elastic: fewest workers.")
    max_workers: int | None = Field(None, ge=1, le=MAX_WORKERS, description="Elastic: most workers.")
    max_failures: int = Field(
        DEFAULT_MAX_FAILURES,
        ge=0,
        le=1000,
        description="Restarts from the last checkpoint (the last epoch's) after a worker dies or "
        "raises (the core's FailureConfig.max_failures); 0: the first failure ends the run. The "
        "same error twice before any epoch ends is not retried.",
    )

    @field_validator("max_failures", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:  # 2.5 or "3" would be coerced
            raise ValueError(
                f"must be a whole number >= 0 (restarts from the last checkpoint after a worker fails; "
                f"0: none), got {value!r}"
            )
        return value

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return check_resources(value)

    @field_validator("strategy", mode="before")
    @classmethod
    def _ludwig_spelling(cls, value: Any) -> Any:
        return strategy_from_ludwig(value)

    @model_validator(mode="after")
    def _check_bounds(self) -> BackendTrainer:
        lo, hi = self.min_workers, self.max_workers
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_workers ({lo}) must not exceed max_workers ({hi})")
        return self


class BackendConfig(ConfigModel):
    type: Literal["local", "ray", "launcher", "horovod", "deepspeed"] | None = Field(
        None,
        description="local: one process; ray: workers on Ray; launcher (Ludwig's horovod and "
        "deepspeed name it too): the processes torchrun, horovodrun, mpirun or the deepspeed "
        "launcher started, which it requires. Unset: ray if a cluster is reachable, else local. "
        "Whatever it says, a process such a launcher started joins the launcher's group.",
    )
    processor: ProcessorConfig = Field(default_factory=lambda: ProcessorConfig(), description="Preprocessing engine.")
    trainer: BackendTrainer = Field(default_factory=lambda: BackendTrainer(), description="Distributed training.")
    cache_dir: str | None = Field(None, description="fsspec URI caching preprocessed data by config + data fingerprint.")


def _inferred_validation_field(data: Any) -> Any:
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
        if isinstance(out, dict) and out.get("type") in OUTPUT_TYPES
        and metric_name(metric) in metrics_measured(out["type"], "validation")
    ]
    if len(owners) > 1:
        raise ValueError(
            f"trainer.validation_metric: {metric!r} is measured on the outputs {owners}; set "
            "trainer.validation_field to the one it follows"
        )
    return {**data, "trainer": {**trainer, "validation_field": owners[0]}} if owners else data


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
    combiner: CombinerConfig = Field(default_factory=lambda: CombinerConfig(), description="Combiner.")
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

    # What the config as written set itself (``ludwig.own_settings``): the feature-level
    # hyperopt parameters (``set_path``'s ``defaults.<type>...``) leave it alone.
    _own: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_own_settings(cls, data: Any, handler: ModelWrapValidatorHandler[ModelConfig]) -> ModelConfig:
        if isinstance(data, ModelConfig):
            return handler(data)
        own = own_settings(data)
        token = _OWN.set(own)  # for _check_hyperopt, which runs inside the handler
        try:
            config = handler(data)
        finally:
            _OWN.reset(token)
        config._own = own
        return config

    @model_validator(mode="before")
    @classmethod
    def _ludwig_keys(cls, data: Any) -> Any:
        # Ludwig's keys with no raylight counterpart, each with its fix; then the output a
        # validation_metric given alone follows
        return _inferred_validation_field(check_ludwig_keys(data))

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
        preprocessed = [key for key, space in value.parameters.items() if _check_parameter(base, key, space, _OWN.get() or {})]
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


def _representatives(space: Any) -> list[Any]:
    if space.space == "choice":
        return list(space.categories)
    if space.space == "grid":
        return list(space.values)
    if space.space == "randint":
        return [space.lower, space.upper - 1]
    return [space.lower, space.upper]


# Ludwig's searchable spellings of the combiner's layers (its hyperopt examples tune them).
LUDWIG_LAYER_KEYS = ("combiner.num_fc_layers", "combiner.output_size")
# At most this many preprocessings of the dataset for one search (hyperopt.preprocessing_variants).
MAX_PREPROCESSINGS = 8
# Ludwig's feature-level hyperopt parameters, defaults.<type>.<section>.<key>: the side
# each section is set on.
FEATURE_LEVEL = {"preprocessing": "input_features", "encoder": "input_features", "decoder": "output_features", "loss": "output_features"}
_OWN: ContextVar[dict[str, dict[str, Any]] | None] = ContextVar("raylight_own_settings", default=None)


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


def _check_parameter(base: dict[str, Any], key: str, space: Any, own: dict[str, dict[str, Any]]) -> bool:
    """``key`` names a config value, and every corner of ``space`` is a valid value.
    True when the key changes preprocessing, which takes a finite space: each of its
    values is preprocessed once, before the trials (``hyperopt.preprocessing_variants``)."""
    if key.split(".")[0] == "hyperopt":
        raise ValueError(f"parameters.{key}: the hyperopt section itself cannot be searched")
    preprocessing = False
    for candidate in _representatives(space):
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
            ModelConfig.model_validate(trial)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"parameters.{key}: the value {candidate!r} of its {space.space} space is not valid there "
                f"({where}: {first['msg']})"
            ) from None
    return preprocessing

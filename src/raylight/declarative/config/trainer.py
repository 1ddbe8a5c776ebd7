"""The ``trainer:`` section of the declarative config: optimizer, gradient clipping,
learning-rate schedule, epochs and batch size, the metric early stopping follows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raylight.config.base import ConfigModel
from raylight.config.schema import (
    AdaptiveConfig,
)
from raylight.declarative.metrics import metric_name

# Upper bounds: far beyond any real use, low enough that a typo fails here and not as an
# allocation of terabytes or a loop of years.
MAX_EPOCHS = 1_000_000
MAX_BATCH = 2**24
MAX_SEED = 2**32 - 1  # what numpy's and torch's generators take


OptimizerType = Literal[
    "adam", "adamw", "sgd", "adadelta", "adagrad", "adamax", "nadam", "rmsprop", "radam",
    "adafactor", "muon", "schedule_free_adamw", "lbfgs",
]

# Each optimizer's own settings (Ludwig's names, which are torch's): a setting given for
# another type is an error. Unset (null), a setting takes torch's default, but for SGD's
# momentum, raylight's 0.9. raylight.declarative.optimizers builds each type.
OPTIMIZER_SETTINGS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "dampening", "nesterov"),
    "adam": ("betas", "eps", "amsgrad"),
    "adamw": ("betas", "eps", "amsgrad"),
    "adadelta": ("rho", "eps"),
    "adagrad": ("initial_accumulator_value", "lr_decay", "eps"),
    "adamax": ("betas", "eps"),
    "nadam": ("betas", "eps", "momentum_decay"),
    "rmsprop": ("momentum", "alpha", "eps", "centered"),
    "radam": ("betas", "eps"),
    "adafactor": (),
    "muon": ("momentum", "nesterov"),
    "schedule_free_adamw": ("betas", "eps", "warmup_steps"),
    "lbfgs": ("max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size", "line_search_fn"),
}
SGD_MOMENTUM = 0.9
CLOSURE_OPTIMIZERS = ("lbfgs",)  # their step evaluates the loss again through a closure


class OptimizerConfig(ConfigModel):
    type: OptimizerType = Field(
        "adam",
        description="Optimizer: torch.optim's class of that name (Ludwig's types); adafactor is torch.optim.Adafactor, muon "
        "torch.optim.Muon on the 2-D weights and AdamW on the rest, schedule_free_adamw the schedulefree package's "
        "AdamWScheduleFree, lbfgs torch.optim.LBFGS (docs/declarative.md, Optimizers).",
    )
    weight_decay: float = Field(0.0, ge=0, le=1, description="Weight decay (every type but lbfgs).")
    momentum: float | None = Field(None, ge=0, lt=1, description="sgd (null: 0.9), rmsprop (null: 0), muon (null: 0.95).")
    dampening: float | None = Field(None, ge=0, le=1, description="sgd: momentum dampening (null: 0).")
    nesterov: bool | None = Field(
        None, description="sgd: Nesterov momentum (null: false; needs momentum > 0 and dampening 0); muon (null: true)."
    )
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] | None = Field(
        None, description="adam, adamw, adamax, nadam, radam, schedule_free_adamw: the moving averages' coefficients (null: [0.9, 0.999])."
    )
    eps: float | None = Field(None, gt=0, le=1, description="Added to denominators (null: torch's default for the type).")
    amsgrad: bool | None = Field(None, description="adam, adamw: the AMSGrad variant (null: false).")
    rho: float | None = Field(None, ge=0, le=1, description="adadelta: the squared gradients' average coefficient (null: 0.9).")
    initial_accumulator_value: float | None = Field(None, ge=0, description="adagrad (null: 0).")
    lr_decay: float | None = Field(None, ge=0, le=1, description="adagrad: learning rate decay (null: 0).")
    momentum_decay: float | None = Field(None, ge=0, description="nadam (null: 0.004).")
    alpha: float | None = Field(None, ge=0, le=1, description="rmsprop: smoothing constant (null: 0.99).")
    centered: bool | None = Field(None, description="rmsprop: normalise by the gradient's variance estimate (null: false).")
    warmup_steps: int | None = Field(None, ge=0, le=2**40, description="schedule_free_adamw: its own linear warm-up, in steps (null: 0).")
    max_iter: int | None = Field(None, ge=1, le=1_000_000, description="lbfgs: iterations per optimizer step (null: 20).")
    max_eval: int | None = Field(None, ge=1, le=1_000_000, description="lbfgs: loss evaluations per step (null: 1.25 x max_iter).")
    tolerance_grad: float | None = Field(None, ge=0, description="lbfgs: stop a step at this first-order optimality (null: 1e-7).")
    tolerance_change: float | None = Field(None, ge=0, description="lbfgs: stop a step at this change of loss or weights (null: 1e-9).")
    history_size: int | None = Field(None, ge=1, le=100_000, description="lbfgs: the updates remembered (null: 100).")
    line_search_fn: Literal["strong_wolfe"] | None = Field(None, description="lbfgs: strong_wolfe, or null: a fixed step.")

    @model_validator(mode="after")
    def _settings_of_its_type(self) -> OptimizerConfig:
        own = OPTIMIZER_SETTINGS[self.type]
        for name in sorted({n for names in OPTIMIZER_SETTINGS.values() for n in names} - set(own)):
            if getattr(self, name) is not None:
                takers = [t for t, names in OPTIMIZER_SETTINGS.items() if name in names]
                raise ValueError(f"{name} is a setting of {', '.join(takers)}, not of {self.type}; remove it")
        if self.type == "sgd" and self.nesterov and (self.kwargs()["momentum"] <= 0 or (self.dampening or 0) != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening 0")
        if self.type == "lbfgs" and self.weight_decay:
            raise ValueError(
                "lbfgs takes no weight_decay (torch's LBFGS has none); set it to 0 and use "
                "trainer.regularization_lambda (regularization_type: l2) for a penalty"
            )
        if self.type == "schedule_free_adamw":
            import importlib.util

            if importlib.util.find_spec("schedulefree") is None:
                raise ValueError(
                    "schedule_free_adamw needs the schedulefree package, which is not installed: "
                    "pip install 'raylight[declarative]' (or pip install schedulefree)"
                )
        return self

    def kwargs(self) -> dict[str, Any]:
        """The optimizer's keyword arguments beside the learning rate."""
        out: dict[str, Any] = {} if self.type == "lbfgs" else {"weight_decay": self.weight_decay}
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
    loss_balancing: Literal["none", "log_transform", "uncertainty", "famo", "nash_mtl", "pareto_mtl"] = Field(
        "none",
        description="Ludwig's: how the outputs' losses make the one trained on: none (their sum, each times its "
        "loss_weight), log_transform (of log(1 + loss)), uncertainty (Kendall et al.'s learned log-variances), famo "
        "(FAMO's adaptive weights), nash_mtl (Nash-MTL's bargaining weights, one backward pass per output), "
        "pareto_mtl (a preference vector's linear and Tchebycheff mix); raylight.declarative.loss_balancing.",
    )
    loss_balancing_lr: float = Field(0.01, gt=0, le=10, description="famo: the rate of its weights' Adam steps.")
    loss_balancing_preference_vector: list[Annotated[float, Field(ge=0)]] | None = Field(
        None, description="pareto_mtl: one non-negative entry per output, in order (normalised); null: uniform."
    )
    loss_balancing_tchebycheff_weight: float = Field(
        0.5, ge=0, le=1, description="pareto_mtl: the Tchebycheff (max) term's share; the linear term takes the rest."
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

    @model_validator(mode="after")
    def _one_pass_per_step(self) -> TrainerSection:
        if self.optimizer.type in CLOSURE_OPTIMIZERS:
            if self.batch_size == "auto":
                raise ValueError(
                    f"optimizer.type: {self.optimizer.type} evaluates the loss several times per step (a closure), which the "
                    "adaptive engine's accumulated steps of batch_size: auto cannot: give batch_size a number"
                )
            if self.loss_balancing == "nash_mtl":
                raise ValueError("loss_balancing: nash_mtl with optimizer.type: lbfgs is not available; use another balancing")
        if self.loss_balancing not in ("none", "log_transform", "pareto_mtl") and self.batch_size == "auto":
            raise ValueError(
                f"loss_balancing: {self.loss_balancing} learns from each step's losses, which the adaptive engine's "
                "accumulated steps of batch_size: auto do not give it: give batch_size a number"
            )
        return self

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

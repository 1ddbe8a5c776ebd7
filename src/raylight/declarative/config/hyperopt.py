"""The declarative ``hyperopt:`` section: what to search, how, and on what resources.

Pure data like the rest of the config. Key paths of ``parameters`` are checked against
the model config by ``ModelConfig`` (it knows which keys exist).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from raylight.config.base import ConfigModel
from raylight.declarative.metrics import metric_key, metric_name


# -- search spaces -------------------------------------------------------------------
class ChoiceSpace(ConfigModel):
    space: Literal["choice"]
    categories: list[Any] = Field(min_length=1, description="Values sampled uniformly.")


class GridSpace(ConfigModel):
    space: Literal["grid"]
    values: list[Any] = Field(min_length=1, description="Every value is tried (times num_samples).")


class UniformSpace(ConfigModel):
    space: Literal["uniform"]
    lower: float = Field(description="Lowest value.")
    upper: float = Field(description="Highest value.")

    @model_validator(mode="after")
    def _order(self) -> UniformSpace:
        if not self.lower < self.upper:
            raise ValueError(f"needs lower < upper, got lower={self.lower:g}, upper={self.upper:g}")
        return self


class LogUniformSpace(ConfigModel):
    space: Literal["loguniform"]
    lower: float = Field(gt=0, description="Lowest value (> 0).")
    upper: float = Field(gt=0, description="Highest value.")

    @model_validator(mode="after")
    def _order(self) -> LogUniformSpace:
        if not self.lower < self.upper:
            raise ValueError(f"needs 0 < lower < upper, got lower={self.lower:g}, upper={self.upper:g}")
        return self


class RandIntSpace(ConfigModel):
    space: Literal["randint"]
    lower: int = Field(description="Lowest integer.")
    upper: int = Field(description="Highest integer, exclusive (as in Ray Tune).")

    @model_validator(mode="after")
    def _order(self) -> RandIntSpace:
        if not self.lower < self.upper:
            raise ValueError(f"needs lower < upper (upper exclusive), got lower={self.lower}, upper={self.upper}")
        return self


Space = Annotated[
    ChoiceSpace | GridSpace | UniformSpace | LogUniformSpace | RandIntSpace, Field(discriminator="space")
]


# -- schedulers ----------------------------------------------------------------------
class FifoScheduler(ConfigModel):
    type: Literal["fifo"]


class AshaScheduler(ConfigModel):
    type: Literal["async_hyperband", "asha"]
    max_t: int = Field(100, ge=1, description="Most epochs a trial runs.")
    grace_period: int = Field(1, ge=1, description="Epochs every trial runs before it can be stopped.")
    reduction_factor: float = Field(3.0, gt=1, description="Only 1/reduction_factor of trials go on at each rung.")

    @model_validator(mode="after")
    def _grace(self) -> AshaScheduler:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period ({self.grace_period}) must not exceed max_t ({self.max_t})")
        return self


class MedianStoppingScheduler(ConfigModel):
    type: Literal["median_stopping"]
    grace_period: float = Field(1.0, ge=0, description="Epochs before a trial can be stopped.")
    min_samples_required: int = Field(3, ge=1, description="Trials needed to compute a median.")


class PbtScheduler(ConfigModel):
    type: Literal["pbt"]
    perturbation_interval: int = Field(2, ge=1, description="Epochs between exploit/explore steps.")
    quantile_fraction: float = Field(0.25, gt=0, le=0.5, description="Bottom fraction copies the top fraction.")
    resample_probability: float = Field(0.25, ge=0, le=1, description="Chance to resample a value instead of perturbing it.")


Scheduler = Annotated[
    FifoScheduler | AshaScheduler | MedianStoppingScheduler | PbtScheduler, Field(discriminator="type")
]


class SearchAlgConfig(ConfigModel):
    type: Literal["random", "grid", "optuna"] = Field(
        "random",
        description="random: sample the spaces (grid spaces are crossed); grid: every grid value, "
        "only grid and choice spaces; optuna: TPE (needs the optuna package).",
    )
    seed: int | None = Field(None, description="Seed of the search algorithm.")

    @model_validator(mode="before")
    @classmethod
    def _ludwig_spelling(cls, data: Any) -> Any:
        """Ludwig's variant_generator is Tune's random/grid generator, raylight's random;
        its random_state is the seed."""
        if isinstance(data, dict) and (data.get("type") == "variant_generator" or "random_state" in data):
            data = dict(data)
            if data.get("type") == "variant_generator":
                data["type"] = "random"
            if "random_state" in data:
                state = data.pop("random_state")
                data.setdefault("seed", state)
        return data


class ExecutorConfig(ConfigModel):
    num_samples: int = Field(10, ge=1, description="Trials to run (for grid spaces: repeats of the grid).")
    max_concurrent_trials: int | Literal["auto"] = Field(
        "auto",
        description="Trials at once; auto: as many as the cluster's CPUs and GPUs hold side by side.",
    )
    cpu_resources_per_trial: float | None = Field(
        None,
        gt=0,
        description="CPUs of one trial, all its workers together; default: backend.trainer.num_workers "
        "x the workers' CPUs. Sets the number of workers when backend.trainer.num_workers is unset.",
    )
    gpu_resources_per_trial: float = Field(
        0.0, ge=0, description="GPUs of one trial; > 0 gives each worker GPU / num_workers and uses NCCL."
    )
    time_budget_s: float | None = Field(None, gt=0, description="Stop the whole search after this many seconds.")
    scheduler: Scheduler = Field(
        default_factory=lambda: FifoScheduler(type="fifo"), description="Trial scheduler (early stopping, PBT)."
    )

    @model_validator(mode="after")
    def _concurrency(self) -> ExecutorConfig:
        if isinstance(self.max_concurrent_trials, int) and self.max_concurrent_trials < 1:
            raise ValueError(f"max_concurrent_trials must be >= 1 or 'auto', got {self.max_concurrent_trials}")
        return self


class HyperoptConfig(ConfigModel):
    parameters: dict[str, Space] = Field(
        min_length=1,
        description="Config keys by dotted path (trainer.learning_rate, combiner.fc_layers.0.output_size) "
        "and the space each is searched in.",
    )
    goal: Literal["minimize", "maximize"] = Field("minimize", description="Whether the metric should go down or up.")
    metric: str = Field(
        "loss",
        description="Metric of the output feature to optimise: loss or any other it measures (as "
        "trainer.validation_metric).",
    )
    split: Literal["validation", "training"] = Field("validation", description="Split the metric is measured on.")
    output_feature: str = Field(
        "combined",
        description="Ludwig's: the output the metric is of, by its name, or combined (with several outputs: their "
        "weighted losses added up, whose one metric is loss).",
    )
    eval_split: Literal["validation", "training"] | None = Field(None, description="Ludwig's: null or the same as split.")
    search_alg: SearchAlgConfig = Field(default_factory=lambda: SearchAlgConfig(), description="Search algorithm.")
    executor: ExecutorConfig = Field(default_factory=lambda: ExecutorConfig(), description="Trials and their resources.")

    _metric_name = field_validator("metric")(metric_name)

    @model_validator(mode="after")
    def _grid_only(self) -> HyperoptConfig:
        if self.eval_split is not None and self.eval_split != self.split:
            raise ValueError(f"eval_split ({self.eval_split}) differs from split ({self.split}); raylight measures one: set split")
        if self.search_alg.type == "grid":
            bad = sorted(k for k, v in self.parameters.items() if v.space not in ("grid", "choice"))
            if bad:
                raise ValueError(
                    f"search_alg grid needs grid or choice spaces; {bad} use continuous spaces; "
                    "use search_alg: {type: random} or give them a grid"
                )
        if self.search_alg.type == "optuna":
            bad = sorted(k for k, v in self.parameters.items() if v.space == "grid")
            if bad:
                raise ValueError(f"search_alg optuna does not take grid spaces ({bad}); use choice")
        if isinstance(self.executor.scheduler, PbtScheduler):
            bad = sorted(k for k, v in self.parameters.items() if v.space == "grid")
            if bad:
                raise ValueError(f"scheduler pbt cannot mutate grid spaces ({bad}); use choice")
        return self

    # The model's output names, and the parameters that change preprocessing (each value
    # preprocessed before the trials), set by ModelConfig's check of this section.
    _outputs: list[str] = PrivateAttr(default_factory=list)
    _preprocessed: list[str] = PrivateAttr(default_factory=list)

    @property
    def metric_name(self) -> str:
        """The name of the reported metric: validation_<key> or train_<key>, its key
        ``metric_key``'s (``<output>/<metric>`` with several outputs)."""
        key = metric_key(self._outputs or [self.output_feature], self.output_feature, self.metric)
        return f"{'validation' if self.split == 'validation' else 'train'}_{key}"

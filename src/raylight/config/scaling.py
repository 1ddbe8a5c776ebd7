"""The ``scaling`` section: how many workers, with which resources, placed how, running
which strategy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from raylight.config.base import ConfigModel
from raylight.config.deepspeed import DEEPSPEED_BATCH_KEYS, DeepSpeed
from raylight.config.strategies import FSDP, StrategySetting, check_strategy_name

Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


MAX_WORKERS = 100_000
MAX_RESOURCE = 1_000_000.0  # of one resource for one worker
WORKER_CPUS = 1.0  # one worker's CPUs where its resources name none (every product's default)
WORKER_GPUS = 1.0  # ... and its GPUs where it uses GPUs and its resources name none


def default_worker_resources(resources: dict[str, float] | None, *, use_gpu: bool) -> dict[str, float]:
    """One worker's resources: ``resources`` with the defaults filled in (WORKER_CPUS, and
    WORKER_GPUS when ``use_gpu``), as floats; amounts of 0 kept."""
    res = {k: float(v) for k, v in (resources or {}).items()}
    res.setdefault("CPU", WORKER_CPUS)
    if use_gpu:
        res.setdefault("GPU", WORKER_GPUS)
    return res


def check_resources(value: dict[str, float] | None) -> dict[str, float] | None:
    """Ray resources of one worker: names are non-empty, amounts finite, in
    [0, MAX_RESOURCE], and some CPU or GPU."""
    if value is None:
        return None
    for key, amount in value.items():
        if not key or not key.strip():
            raise ValueError("resource names must not be empty")
        if not 0 <= amount <= MAX_RESOURCE:
            raise ValueError(f"resource {key!r} must be between 0 and {MAX_RESOURCE:g}, got {amount}")
    if value.get("CPU", WORKER_CPUS) == 0 and value.get("GPU", 0) == 0:
        raise ValueError("a worker needs at least some CPU or GPU, got CPU: 0")
    return value


class ScalingConfig(ConfigModel):
    """How many workers, with which resources, placed how."""

    num_workers: int | tuple[int, int] = Field(
        1,
        description="Number of data-parallel worker processes, or (min, max) for an elastic "
        "job whose size raylight chooses and changes. 0 runs the loop in this process "
        "without Ray, for debugging.",
    )
    use_gpu: bool = Field(False, description="Give each worker one GPU and use NCCL.")
    resources_per_worker: dict[str, float] | None = Field(
        None,
        description=f"Ray resources per worker, e.g. {{'CPU': 2}}. Default: {WORKER_CPUS:g} CPU, plus "
        f"{WORKER_GPUS:g} GPU when use_gpu.",
    )
    placement: Placement = Field(
        "PACK", description="Placement-group strategy for the workers' bundles."
    )
    threads_per_worker: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="torch intra-op threads in each worker. Default: the worker's CPU count.",
    )
    strategy: StrategySetting = Field(
        "ddp",
        description="How the model is replicated or sharded: 'ddp' (every worker holds the "
        "whole model), 'fsdp' (sharded, PyTorch FSDP2), 'deepspeed' (DeepSpeed ZeRO), "
        "'horovod' (replicated, gradients averaged by Horovod's DistributedOptimizer), or "
        "FSDP(...) / DeepSpeed(...) / Horovod(...) for their options.",
    )
    scaling_policy: Literal["goodput", "max"] = Field(
        "goodput",
        description="Elastic jobs: 'goodput' picks the size the fitted throughput model "
        "predicts is best; 'max' runs as many workers as fit, up to max.",
    )
    utility_threshold: float = Field(
        0.5,
        ge=0,
        description="Elastic jobs grow to K workers only while speedup(K) / K stays at least this.",
    )
    resize_hysteresis: float = Field(
        0.1, ge=0, description="A resize must promise this much more goodput (0.1 = 10%)."
    )
    resize_horizon_s: float = Field(
        120.0,
        gt=0,
        description="A resize must save more time than it costs within this horizon.",
    )
    resize_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often elastic jobs reconsider their size; after a resize, counted "
        "from the first step at the new size.",
    )
    scheduler_weight: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Where the cluster's raylight scheduler runs (`raylight scheduler start`): "
        "this run's weight in its weighted power mean of speedups, so a run of weight 2 counts "
        "as two of weight 1 when slots are shared. Ignored without a scheduler.",
    )
    resize_in_place: bool = Field(
        True,
        description="Resize elastic jobs in place (live workers keep running, new ones get "
        "the state by broadcast); False always restarts from the last checkpoint (DeepSpeed "
        "runs always do: the engine is bound to its process group).",
    )
    warm_spare: bool = Field(
        True,
        description="Elastic CPU jobs below max workers keep one pre-started, warmed worker "
        "process beside rank 0; it holds no Ray resources until a grow reserves a bundle on "
        "its node and it joins (decision to first step well under a second instead of a "
        "process start). False: grow by starting new processes.",
    )
    reuse_workers: bool = Field(
        True,
        description="Keep the worker processes of a run that ends cleanly for the next run "
        "of this driver (a second fit, Lightning's validate after fit, the next Tune trial in "
        "the same process): it then starts in well under a second instead of starting and "
        "importing new processes. Idle workers hold no Ray resources. CPU workers of DDP runs "
        "only; see docs/performance.md for what a reused process keeps. False: every run "
        "starts new processes.",
    )
    idle_worker_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Idle workers kept for reuse are killed after this many seconds unused "
        "(and when the driver exits, or by raylight.release_workers()).",
    )
    autoscale: bool = Field(
        False,
        description="When more workers would help than fit, ask the Ray autoscaler for them "
        "(ray.autoscaler.sdk.request_resources).",
    )
    launcher: Literal["auto", "ignore"] = Field(
        "auto",
        description="auto: when torchrun, the deepspeed launcher, horovodrun, mpirun or "
        "`raylight run` started this process (their environment variables say so), join the "
        "group they started instead of starting Ray workers: every rank runs the loop, rank 0 "
        "records the run, num_workers is the launcher's. ignore: start Ray workers (or run in "
        "this process) as if no launcher had.",
    )

    # The strategy whose code the worker processes run, where an integration runs one
    # under another's worker group (the Lightning RayFSDPStrategy: FSDP in the
    # processes of a "ddp" group). Not a setting: see ``for_processes_of``.
    _process_kind: str | None = PrivateAttr(default=None)

    @field_validator("strategy", mode="before")
    @classmethod
    def _check_strategy_name(cls, value: object) -> object:
        return check_strategy_name(value)

    @field_validator("num_workers")
    @classmethod
    def _check_num_workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(value, tuple):
            lo, hi = value
            if not 1 <= lo <= hi <= MAX_WORKERS:
                raise ValueError(f"(min, max) needs 1 <= min <= max <= {MAX_WORKERS}, got {value}")
        elif not 0 <= value <= MAX_WORKERS:
            raise ValueError(f"must be between 0 (0 runs in this process) and {MAX_WORKERS}, got {value}")
        return value

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple) and self.num_workers[0] != self.num_workers[1]

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return check_resources(value)

    @model_validator(mode="after")
    def _check_gpu(self) -> ScalingConfig:
        res = self.resources_per_worker or {}
        if res.get("GPU", 0) > 0 and not self.use_gpu:
            raise ValueError(
                "resources_per_worker asks for GPUs but use_gpu is false; set use_gpu=True"
            )
        share = res.get("GPU", 0)
        if self.use_gpu and 0 < share < 1 and self.max_workers > 1:
            raise ValueError(
                f"resources_per_worker GPU: {share:g} lets workers of this run share a GPU, and NCCL "
                "trains one rank per GPU (it stops with 'Duplicate GPU detected'); give each worker a "
                "whole GPU (GPU: 1), or share GPUs between runs of one worker each (Tune trials)"
            )
        if isinstance(self.strategy, FSDP) and self.strategy.cpu_offload and not self.use_gpu:
            raise ValueError(
                "strategy.cpu_offload needs use_gpu=True: CPU workers keep their shards in CPU "
                "memory already; remove cpu_offload"
            )
        if self.strategy_name == "deepspeed":
            self._check_deepspeed()
        return self

    def _check_deepspeed(self) -> None:
        if self.num_workers == 0:
            raise ValueError(
                "strategy 'deepspeed' needs worker processes with torch.distributed; "
                "num_workers=0 runs the loop in this process without it: set num_workers >= 1"
            )
        options = self.strategy if isinstance(self.strategy, DeepSpeed) else DeepSpeed()
        given = {k: v for k, v in options.config_dict.items() if k in DEEPSPEED_BATCH_KEYS and v != "auto"}
        train = given.get("train_batch_size")
        if train is None or not isinstance(self.num_workers, int):
            return
        micro = given.get("train_micro_batch_size_per_gpu")
        steps = given.get("gradient_accumulation_steps")
        per_step = self.num_workers * (micro or 1) * (steps or 1)
        exact = micro is not None and steps is not None
        if (train != per_step) if exact else (train % per_step):
            shown = ", ".join(f"{k}={v}" for k, v in given.items())
            raise ValueError(
                f"strategy.config has {shown}, which does not fit num_workers={self.num_workers}: "
                "DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x "
                "gradient_accumulation_steps x workers; fix one, or set it to 'auto'"
            )

    @property
    def strategy_name(self) -> str:
        return self.strategy if isinstance(self.strategy, str) else self.strategy.name

    @property
    def process_kind(self) -> str:
        """The strategy the worker processes are started for (their environment,
        ``strategies.base.worker_env``) and pooled under (``worker_group.pool.pool_key``):
        ``strategy_name``, unless ``for_processes_of`` said otherwise."""
        return self._process_kind or self.strategy_name

    def for_processes_of(self, strategy_name: str) -> ScalingConfig:
        """A copy whose worker processes are started and pooled as ``strategy_name``'s,
        for an integration that runs that strategy's code in them (the copy's own strategy
        still decides everything else)."""
        copy = self.model_copy()
        copy._process_kind = strategy_name
        return copy

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether the workers write their checkpoints' shards into the run's storage
        themselves: a sharded strategy with checkpoint='sharded' and more than one worker."""
        defaults: dict[str, Any] = {"fsdp": FSDP(), "deepspeed": DeepSpeed()}
        options = defaults.get(self.strategy, self.strategy) if isinstance(self.strategy, str) else self.strategy
        return self.max_workers > 1 and getattr(options, "checkpoint", "full") == "sharded"

    @property
    def resizes_in_place(self) -> bool:
        """Whether an elastic resize keeps the live workers (``resize_in_place``, and a
        strategy whose state moves to a new group in place: DeepSpeed's engine is bound to
        the process group it was built in, so its runs resize by a restart from the last
        checkpoint)."""
        return self.resize_in_place and self.strategy_name != "deepspeed"

    def worker_resources(self) -> dict[str, float]:
        """Resources of one worker's bundle, defaults filled in."""
        res = default_worker_resources(self.resources_per_worker, use_gpu=self.use_gpu)
        return {k: v for k, v in res.items() if v > 0}

    def worker_threads(self) -> int:
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return max(1, int(self.worker_resources().get("CPU", 1)))

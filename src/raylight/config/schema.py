"""The settings of a training run. One home per setting; every field documented.

Models are frozen and forbid unknown keys, so a typo is an error naming the full key
path rather than a silently ignored setting.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

from raylight.config.base import ConfigModel
from raylight.config.loggers import LoggerSetting, parse_loggers

Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
# How the learning rate follows the batch size; raylight.adaptive.lr implements each.
LRRule = Literal["adascale", "sqrt", "linear", "legw", "none"]
LR_RULES: tuple[str, ...] = get_args(LRRule)


StrategyName = Literal["ddp", "fsdp", "deepspeed", "horovod"]
STRATEGIES: tuple[str, ...] = get_args(StrategyName)
HorovodImplementation = Literal["auto", "horovod", "raylight"]
HOROVOD_IMPLEMENTATIONS: tuple[str, ...] = get_args(HorovodImplementation)


class DDP(ConfigModel):
    """Distributed data parallel (PyTorch DDP): every worker holds the whole model, and the
    gradients are averaged at every step. Pass ``strategy=DDP(...)`` for these options, or
    ``strategy="ddp"`` for the defaults."""

    name: Literal["ddp"] = Field("ddp", description="The strategy's name (always 'ddp').")
    shared_memory: bool = Field(
        True,
        description="CPU workers on one machine (Linux x86-64) average gradient buckets of up "
        "to 1 MiB through shared memory instead of gloo's TCP all-reduce: several times faster "
        "for small models, the same average (bitwise with two workers). Larger buckets, GPUs "
        "and workers on other machines use the backend either way. False: gloo reduces every "
        "bucket.",
    )


class FSDP(ConfigModel):
    """Fully sharded data parallel (PyTorch FSDP2, ``fully_shard``): each worker holds
    1/N of the parameters, gradients and optimizer state. Pass ``strategy=FSDP(...)``
    for these options, or ``strategy="fsdp"`` for the defaults."""

    name: Literal["fsdp"] = Field("fsdp", description="The strategy's name (always 'fsdp').")
    reshard_after_forward: bool = Field(
        True,
        description="Free the gathered parameters after each block's forward (less memory, "
        "one more all-gather in backward).",
    )
    mixed_precision: Literal["bf16", "fp16"] | None = Field(
        None,
        description="Compute in this dtype (parameters gathered and gradients reduced in it); "
        "the sharded parameters and optimizer stay fp32. None: fp32 throughout.",
    )
    cpu_offload: bool = Field(
        False, description="Keep the sharded parameters, gradients and optimizer state in CPU memory."
    )
    blocks: tuple[str, ...] | None = Field(
        None,
        description="Class names of the submodules to shard one by one (e.g. 'TransformerBlock'). "
        "Default: every submodule holding at least min_block_params parameters not already "
        "in a smaller block.",
    )
    min_block_params: int = Field(
        100_000, ge=1, description="The size threshold of the default block policy."
    )
    checkpoint: Literal["sharded", "full"] = Field(
        "sharded",
        description="'sharded': every worker writes its own shards into the run's storage "
        "(torch.distributed.checkpoint), which must then be reachable from every worker (a "
        "shared filesystem or an object store). 'full': the shards are gathered and rank 0's "
        "full state goes through the driver, as with DDP (each worker then briefly holds the "
        "whole model and optimizer state).",
    )


class Horovod(ConfigModel):
    """Horovod data parallelism: rank 0's parameters broadcast to every worker, gradients
    averaged by ``hvd.DistributedOptimizer`` (no DDP wrapper). Pass
    ``strategy=Horovod(...)`` for these options, or ``strategy="horovod"`` for the defaults."""

    name: Literal["horovod"] = Field("horovod", description="The strategy's name (always 'horovod').")
    implementation: HorovodImplementation = Field(
        "auto",
        description="Which Horovod: 'horovod' (real horovod.torch, which must be installed in "
        "the workers' Python; its gloo controller meets through a rendezvous server raylight "
        "starts on rank 0), 'raylight' (raylight.horovod: Horovod's API on the workers' "
        "torch.distributed group, no install), 'auto' (real Horovod where it is installed, "
        "else raylight.horovod).",
    )
    init_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long real Horovod's gloo rendezvous may take when the workers start "
        "(HOROVOD_GLOO_TIMEOUT_SECONDS).",
    )


# The DeepSpeed config fields raylight owns: "auto" (or absent) is filled from the training
# loader's batch, a number is checked against it.
DEEPSPEED_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# ZeRO's sizes, in elements: (DeepSpeed's default, how many of the model's blocks raylight
# gives it; raylight.worker.strategies.deepspeed.zero_sizes), filled where a config says "auto"
# and, under ZeRO-3, where it says nothing. DeepSpeed's defaults suit billion-parameter
# models on GPUs; under a smaller model they exceed it, so ZeRO-3 would gather, bucket and
# step all of it at once and hold as much memory as DDP.
ZERO_SIZES: dict[str, tuple[int, int]] = {
    "reduce_bucket_size": (500_000_000, 1),
    "stage3_prefetch_bucket_size": (50_000_000, 1),
    "stage3_max_live_parameters": (1_000_000_000, 2),
    "stage3_max_reuse_distance": (1_000_000_000, 2),
    "sub_group_size": (1_000_000_000, 1),
}
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


class DeepSpeed(ConfigModel):
    """DeepSpeed ZeRO (extra ``deepspeed``): stage 1 shards the optimizer state over the
    workers, 2 also the gradients, 3 also the parameters; optionally the optimizer state
    (and with stage 3 the parameters) live in CPU memory. Pass ``strategy=DeepSpeed(...)``
    for these options, or ``strategy="deepspeed"`` for the defaults.

    ``config`` takes a DeepSpeed JSON config (a dict, or the path of a JSON file, read
    when the run is configured). Its ZeRO settings fill the options left unset here;
    set in both, they must agree. Its batch fields are raylight's (see
    ``DEEPSPEED_BATCH_KEYS``).
    """

    name: Literal["deepspeed"] = Field("deepspeed", description="The strategy's name (always 'deepspeed').")
    stage: Literal[1, 2, 3] = Field(
        2,
        description="ZeRO stage: 1 shards the optimizer state, 2 also the gradients, 3 also the "
        "parameters (gathered module by module for forward and backward). Default 2: it "
        "communicates as much as DDP (a reduce-scatter and an all-gather instead of one "
        "all-reduce) while each worker keeps 1/N of the gradients and optimizer state; 3 "
        "saves the parameters too, at the price of gathering them every step. Default "
        "when config gives zero_optimization.stage: that.",
    )
    offload_optimizer: bool = Field(
        False,
        description="Keep the optimizer state (and its fp32 master weights) in CPU memory and "
        "step it there (zero_optimization.offload_optimizer.device 'cpu'). Fastest with "
        "deepspeed.ops.adam.DeepSpeedCPUAdam as the optimizer; torch's optimizers work too.",
    )
    offload_params: bool = Field(
        False,
        description="Stage 3 only: keep the sharded parameters in CPU memory "
        "(zero_optimization.offload_param.device 'cpu').",
    )
    config: dict[str, Any] | str | None = Field(
        None,
        description="A DeepSpeed JSON config: a dict, or the path of a JSON file (read when the "
        "run is configured and kept as its contents). train_batch_size, "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps may be 'auto' (or "
        "absent): raylight fills them from the training loader; numbers are checked against "
        "it. gradient_clipping defaults to 0 (off; DeepSpeed's own default is 1.0), so the "
        "loop learns what it learns under DDP; set it to clip. The optimizer is built in the "
        "loop and passed to ctx.prepare_optimizer, so 'optimizer' and 'scheduler' sections "
        "are refused.",
    )
    checkpoint: Literal["sharded", "full"] = Field(
        "sharded",
        description="'sharded': every worker writes its own shards into the run's storage "
        "(torch.distributed.checkpoint), which must then be reachable from every worker. "
        "'full': the shards are gathered and rank 0's full state goes through the driver, as "
        "with DDP (each worker then briefly holds the whole model and optimizer state).",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_config(cls, data: Any) -> Any:
        """Read a config file, check the JSON, and take the ZeRO settings it gives for the
        options not set here (set in both, they must agree)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        raw = data.get("config")
        if isinstance(raw, str):
            data["config"] = raw = _read_json(raw)
        if isinstance(raw, dict):
            check_deepspeed_json(raw)
            for field, (key, value) in _json_options(raw).items():
                if field in data and data[field] != value:
                    raise ValueError(
                        f"{field}={data[field]!r} but config {key} gives {value!r}; set one of "
                        "them, or make them agree"
                    )
                data[field] = value
        return data

    @property
    def config_dict(self) -> dict[str, Any]:
        """The DeepSpeed JSON config (a file given as ``config`` was read when validated)."""
        assert not isinstance(self.config, str), "a config path is read when the model is validated"
        return self.config or {}

    @model_validator(mode="after")
    def _check_stage(self) -> DeepSpeed:
        if self.offload_params and self.stage != 3:
            raise ValueError(
                f"offload_params needs stage=3 (parameters are sharded, and can live in CPU "
                f"memory, only with ZeRO-3), got stage={self.stage}; set stage=3 or remove "
                "offload_params"
            )
        return self


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(os.path.expanduser(path)) as f:
            value = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the DeepSpeed config file {path!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the DeepSpeed config file {path!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"the DeepSpeed config file {path!r} must hold a JSON object, got {type(value).__name__}")
    return value


def check_deepspeed_json(config: dict[str, Any]) -> None:
    """The checks raylight can make of a DeepSpeed JSON config before a worker starts;
    DeepSpeed checks the rest when the engine is built. Errors name the key."""
    for key in ("optimizer", "scheduler"):
        if key in config:
            raise ValueError(
                f"config {key}: raylight's loop builds the optimizer and any LR scheduler in "
                "torch (e.g. torch.optim.AdamW(model.parameters(), lr=...)) and passes the "
                "optimizer to ctx.prepare_optimizer, so its state is checkpointed in torch's "
                f"layout; remove the '{key}' section"
            )
    for key in DEEPSPEED_BATCH_KEYS:
        value = config.get(key, "auto")
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"config {key} must be 'auto' or a positive integer, got {value!r}")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ValueError(f"config zero_optimization must be a JSON object, got {type(zero).__name__}")
    stage = zero.get("stage")
    if stage is not None and stage not in (1, 2, 3):
        hint = " (stage 0 is plain data parallelism: use strategy 'ddp')" if stage == 0 else ""
        raise ValueError(f"config zero_optimization.stage must be 1, 2 or 3, got {stage!r}{hint}")
    for section in ("offload_optimizer", "offload_param"):
        part = zero.get(section)
        if part is None:
            continue
        device = part.get("device", "none") if isinstance(part, dict) else part
        if device not in _OFFLOAD_DEVICES:
            raise ValueError(
                f"config zero_optimization.{section}.device must be one of "
                f"{list(_OFFLOAD_DEVICES)}, got {device!r}"
            )
    filled = [*DEEPSPEED_BATCH_KEYS, *(f"zero_optimization.{key}" for key in ZERO_SIZES)]
    for path, value in _walk(config):
        if value == "auto" and path not in filled:
            raise ValueError(f"config {path} is 'auto': raylight fills only {filled}; give it a value")


def _walk(value: Any, path: str = "") -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}.{i}")
    else:
        yield path, value


def _json_options(config: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The options a DeepSpeed JSON config sets: {field: (its key in the JSON, value)}."""
    zero = config.get("zero_optimization", {})
    found: dict[str, tuple[str, Any]] = {}
    if "stage" in zero:
        found["stage"] = ("zero_optimization.stage", zero["stage"])
    for field, section in (("offload_optimizer", "offload_optimizer"), ("offload_params", "offload_param")):
        if section in zero:
            part = zero[section]
            device = part.get("device", "none") if isinstance(part, dict) else part
            found[field] = (f"zero_optimization.{section}.device", device != "none")
    return found


def _strategy_kind(value: object) -> str | None:
    if isinstance(value, str):
        return "name"
    if isinstance(value, DeepSpeed) or (isinstance(value, dict) and value.get("name") == "deepspeed"):
        return "deepspeed"
    if isinstance(value, Horovod) or (isinstance(value, dict) and value.get("name") == "horovod"):
        return "horovod"
    if isinstance(value, DDP) or (isinstance(value, dict) and value.get("name") == "ddp"):
        return "ddp"
    if isinstance(value, FSDP | dict):
        return "fsdp"
    return None


# A name, or a strategy's options; a bad value gets one error, not one per alternative.
StrategySetting = Annotated[
    Annotated[StrategyName, Tag("name")]
    | Annotated[DDP, Tag("ddp")]
    | Annotated[FSDP, Tag("fsdp")]
    | Annotated[DeepSpeed, Tag("deepspeed")]
    | Annotated[Horovod, Tag("horovod")],
    Discriminator(
        _strategy_kind,
        custom_error_type="strategy",
        custom_error_message="must be 'ddp', 'fsdp', 'deepspeed', 'horovod', raylight.DDP(...), "
        "raylight.FSDP(...), raylight.DeepSpeed(...) or raylight.Horovod(...)",
    ),
]


def check_strategy_name(value: object) -> object:
    """A strategy setting whose name (alone, or a mapping's ``name``) is not a strategy's
    gets one error listing them."""
    name = value.get("name") if isinstance(value, dict) else value
    if isinstance(name, str) and name not in STRATEGIES:
        raise ValueError(
            f"must be one of {list(STRATEGIES)}, raylight.DDP(...), raylight.FSDP(...), "
            f"raylight.DeepSpeed(...) or raylight.Horovod(...), got {name!r}"
        )
    return value


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


class AdaptiveConfig(ConfigModel):
    """Batch size, gradient accumulation and learning rate chosen online for goodput."""

    max_batch_size: int | None = Field(
        None, ge=1, description="Largest global batch to consider. Default: 32x the initial batch. Never more than the "
        "training set (the adaptive loader's samples per epoch)."
    )
    local_batch_bounds: tuple[int, int] | None = Field(
        None,
        description="(min, max) samples per worker per micro-step (memory bounds). Default: "
        "(1, max_batch_size).",
    )
    accumulation: bool = Field(
        True, description="Allow gradient accumulation to reach batches beyond the memory bound."
    )
    lr_rule: LRRule = Field(
        "adascale",
        description="How the learning rate follows the batch size: adascale (SGD), sqrt "
        "(Adam family), linear, legw (linear with warm-up), none.",
    )
    lr_warmup_steps: float = Field(
        0.0, ge=0, description="legw: warm-up length in steps at the initial batch size."
    )
    gain_threshold: float = Field(
        0.05, ge=0, description="Change the batch size only for at least this predicted gain."
    )
    decision_interval_s: float = Field(
        3.0, gt=0, description="How often the driver refits the model and reconsiders."
    )
    min_profile_steps: int = Field(
        5, ge=1, description="Optimizer steps a layout needs before its timing is trusted."
    )
    profile_memory_steps: float | None = Field(
        500.0,
        gt=0,
        description="The throughput model follows recent step times: a step of a layout "
        "weighs exp(-n / this) once n more optimizer steps of that layout have run, so the "
        "model tracks a machine whose speed drifts; a poll's steps count as at most 2x the "
        "layout's recent mean, so a stall of a few seconds is not taken for its speed. None: "
        "every step weighs alike (AdaptDL).",
    )
    control_interval_steps: int = Field(
        16,
        ge=1,
        description="Every this many optimizer steps the workers agree on the plan and stop "
        "requests, and measure gradient noise; larger is cheaper but reacts later.",
    )
    noise_smoothing: float = Field(
        0.98, ge=0, lt=1, description="EMA smoothing of the gradient-noise statistics."
    )

    @field_validator("local_batch_bounds")
    @classmethod
    def _check_bounds(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1]:
            raise ValueError(f"needs 1 <= min <= max, got {value}")
        return value


LEASE_TIMEOUT_S = 60.0  # RunConfig.lease_timeout_s's default (and the run recorder's)


class RunConfig(ConfigModel):
    """Where a run lives and how it reports."""

    name: str | None = Field(
        None,
        description="Run name; the run directory is <storage_path>/<name>. Default: "
        "'run-<timestamp>'. Needed to resume a run.",
    )
    storage_path: str | None = Field(
        None,
        description="Local directory or fsspec URI (s3://, gs://, memory://) for run "
        "directories. Default: ~/raylight_results.",
    )
    checkpoints_to_keep: int = Field(
        2, ge=1, description="Committed checkpoints kept; older ones are deleted."
    )
    resume: bool = Field(
        False,
        description="Continue the run named `name` from its last committed checkpoint.",
    )
    progress: bool = Field(True, description="Show the live progress display on the driver.")
    loggers: list[LoggerSetting] = Field(
        default_factory=list,
        description="Experiment loggers the driver writes each report to: 'tensorboard', "
        "'mlflow', 'wandb', or their options ({'type': 'mlflow', 'tracking_uri': ...}, "
        "raylight.config.MLflow(...)). Needs `pip install 'raylight[loggers]'`.",
    )
    verbose: bool | None = Field(
        None,
        description="Show Ray's own output on the driver too (Ray Data's progress and INFO "
        "lines, Ray's INFO logs). Default: the RAYLIGHT_VERBOSE environment variable (which "
        "`raylight --verbose` sets), else off: raylight's display, warnings and errors only.",
    )
    lease_timeout_s: float = Field(
        LEASE_TIMEOUT_S,
        gt=0,
        le=86_400,
        description="Run directories on object stores: a driver holding a run (its lease) "
        "that has not renewed it for this long is taken to be gone, and another driver may "
        "take the run over. On a local disk a dead driver's lease ends at once.",
    )

    prices: dict[str, float] | None = Field(
        None,
        description="USD per hour of each node type the run's workers use (the autoscaler's "
        "node type, 'head', or a node's shape such as 'CPU:8'); '*' prices every type not "
        "named. Result.cost then says what the run cost (node-hours x price). Default: the "
        "RAYLIGHT_PRICES environment variable (set by `raylight submit --price`), else none.",
    )

    _parse_loggers = field_validator("loggers", mode="before")(parse_loggers)

    @field_validator("prices")
    @classmethod
    def _check_prices(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for node_type, price in (value or {}).items():
            if not node_type.strip():
                raise ValueError("a node type must be a non-empty string, e.g. {'m5.xlarge': 0.192}")
            if price < 0:
                raise ValueError(f"the price of {node_type!r} must be >= 0 USD per hour, got {price:g}")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and (
            not value or "/" in value or "\\" in value or value in {".", ".."}
            or any(ord(c) < 32 for c in value) or len(value.encode()) > 255
        ):
            raise ValueError(
                f"must be a plain directory name (no '/', '\\' or control characters, at most "
                f"255 bytes), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_resume(self) -> RunConfig:
        if self.resume and self.name is None:
            raise ValueError("resume=True needs the name of the run to resume; set name")
        return self


# How long an address has to answer (FailureConfig.connect_timeout_s, raylight submit's and
# raylight jobs' --connect-timeout).
CONNECT_TIMEOUT_S = 15.0


class FailureConfig(ConfigModel):
    """Fault tolerance, and the timeout of every wait on a remote thing."""

    max_failures: int = Field(
        0,
        ge=-1,
        description="Restarts allowed after worker failures; -1 for unlimited.",
    )
    hang_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A worker that reports no progress (no batch, report or collective) "
        "for this long, counted from when its loop starts, is declared hung. Gathering, "
        "writing or reading a checkpoint counts as progress while it lasts (its collectives "
        "still time out after collective_timeout_s).",
    )
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="A worker that does not answer a health poll in this long is hung."
    )
    poll_interval_s: float = Field(
        0.2, gt=0, description="How often the driver polls workers for status."
    )
    connect_timeout_s: float = Field(
        CONNECT_TIMEOUT_S, gt=0, description="How long to try reaching a Ray cluster given by address."
    )
    placement_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long to wait for the cluster to place all workers before failing.",
    )
    worker_start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long workers may take to start, and to join their process group "
        "before the loop starts.",
    )
    collective_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="torch.distributed timeout for one collective; the driver's hang "
        "detection usually acts first.",
    )
    restart_backoff_s: float = Field(
        1.0,
        ge=0,
        description="Wait before a restart that follows another failure with no new "
        "checkpoint between them; it doubles with each such failure in a row, up to "
        "restart_backoff_max_s. The first restart after progress is immediate.",
    )
    restart_backoff_max_s: float = Field(
        60.0, ge=0, description="The longest wait between restarts (see restart_backoff_s)."
    )
    max_preemptions: int = Field(
        -1,
        ge=-1,
        description="Restarts allowed after nodes were taken away with notice (Ray's node "
        "drain, a SIGTERM, a cloud's preemption notice); they do not count against "
        "max_failures. -1 for unlimited.",
    )
    rendezvous_retries: int = Field(
        1,
        ge=0,
        description="Times a run forms its process group again when a worker fails to join "
        "it (before the loop begins: a peer's connection closed or refused, a port taken in a "
        "race); they do not count against max_failures. A worker that dies is a failure.",
    )
    preemption_notices: list[str] = Field(
        default_factory=list,
        description="Preemption notices the workers watch for, besides Ray's node drain and "
        "SIGTERM: 'aws' (spot instance-action), 'gcp' (preempted, host maintenance), 'azure' "
        "(scheduled events), or 'file:PATH' (a file a preStop hook or spot agent writes). "
        "Each worker polls its node's metadata endpoint every few seconds.",
    )
    preemption_grace_s: float = Field(
        30.0,
        gt=0,
        description="A worker process that gets SIGTERM treats it as its node's preemption "
        "notice and exits this long after it (Kubernetes' default grace period), unless the "
        "driver lets it go first.",
    )


class TrainerConfig(ConfigModel):
    """Everything a `Trainer` needs besides the loop and its own config dict."""

    scaling: ScalingConfig = Field(
        default_factory=lambda: ScalingConfig(), description="Workers and their resources."
    )
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(), description="Run name, storage, reporting."
    )
    failure: FailureConfig = Field(
        default_factory=lambda: FailureConfig(), description="Fault tolerance and timeouts."
    )
    adaptive: AdaptiveConfig | None = Field(
        None, description="Adaptive batch size and learning rate; None keeps them fixed."
    )
    address: str | None = Field(
        None,
        description="Ray cluster to use: 'auto', 'ray://host:port' or host:port. Default: "
        "RAY_ADDRESS if set, else an embedded local Ray started once per process.",
    )

    @model_validator(mode="after")
    def _check_strategy(self) -> TrainerConfig:
        spec = self.scaling.strategy
        if self.scaling.strategy_name == "horovod" and self.adaptive is not None:
            raise ValueError(
                "scaling.strategy 'horovod' cannot run adaptive training (adaptive=...): "
                "hvd.DistributedOptimizer reduces the gradients itself, while adaptive training "
                "measures and reduces them in its own optimizer; remove adaptive, or use strategy 'ddp'"
            )
        if isinstance(spec, DeepSpeed) and self.adaptive is not None:
            fixed = {k: v for k, v in spec.config_dict.items() if k in DEEPSPEED_BATCH_KEYS and v != "auto"}
            if fixed:
                raise ValueError(
                    f"scaling.strategy deepspeed config gives {fixed}, but adaptive=... chooses "
                    "the batch size and accumulation as it trains: set them to 'auto' or remove them"
                )
        return self

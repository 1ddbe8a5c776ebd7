"""DeepSpeed's options (``strategy=DeepSpeed(...)``), and the checks raylight makes of a
DeepSpeed JSON config before a worker starts."""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import Field, model_validator

from raylight.config.base import ConfigModel

# The DeepSpeed config fields raylight owns: "auto" (or absent) is filled from the training
# loader's batch, a number is checked against it.
DEEPSPEED_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# ZeRO's sizes, in elements: (DeepSpeed's default, how many of the model's blocks raylight
# gives it; raylight.worker.strategies.deepspeed_config.zero_sizes), filled where a config says "auto"
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

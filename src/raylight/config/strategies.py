"""The ``scaling.strategy`` setting: a strategy's name, or its options (DDP, FSDP and
Horovod here; DeepSpeed's, with its JSON config, in ``config/deepspeed.py``)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Discriminator, Field, Tag

from raylight.config.base import ConfigModel
from raylight.config.deepspeed import DeepSpeed

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

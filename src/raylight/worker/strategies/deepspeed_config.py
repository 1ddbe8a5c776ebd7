"""DeepSpeed's settings for the engine, from raylight's options and the training loader:
the three batch fields (``resolve_batch``; the batch paragraph of ``deepspeed.py``'s
docstring says when each is fixed), ZeRO's sizes for the model's size, and the config
``deepspeed.initialize`` gets (``engine_config``). Pure: no DeepSpeed, no process group.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from raylight.base.exceptions import ConfigError
from raylight.config.schema import DEEPSPEED_BATCH_KEYS, ZERO_SIZES, DeepSpeed


def _numbers(given: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps of a
    DeepSpeed config; None for "auto" or absent."""
    values = (given.get(key, "auto") for key in DEEPSPEED_BATCH_KEYS)
    return tuple(None if v == "auto" else int(v) for v in values)  # type: ignore[return-value]


def accumulation_steps(given: dict[str, Any], *, world_size: int) -> int:
    """``gradient_accumulation_steps`` for the engine, fixed when it is built (DeepSpeed's
    ZeRO optimizers keep their own copy): the config's number; else what its
    train_batch_size and train_micro_batch_size_per_gpu imply, as DeepSpeed derives it;
    else 1 (each batch the loader yields is one optimizer step)."""
    train, micro, steps = _numbers(given)
    if steps is not None:
        return steps
    if train is not None and micro is not None:
        if train % (micro * world_size):
            raise ValueError(
                f"DeepSpeed config train_batch_size={train} is not a multiple of "
                f"train_micro_batch_size_per_gpu={micro} x {world_size} workers; fix one, or "
                "set it to 'auto'"
            )
        return train // (micro * world_size)
    return 1


def resolve_batch(
    given: dict[str, Any], *, world_size: int, steps: int, micro_batch: int | None, accumulation: int = 1
) -> dict[str, int]:
    """DeepSpeed's three batch fields from the config's (``given``: each ``"auto"``,
    absent or a number), the engine's accumulation ``steps`` and the training loader's
    layout (``micro_batch`` samples per worker in each batch it yields, None before a
    loader is prepared; ``accumulation`` batches per optimizer step). Numbers that
    disagree are errors naming both."""
    train, micro, _ = _numbers(given)
    if micro_batch is not None:
        loader = (
            f"the training loader (prepare_loader(batch_size={micro_batch * world_size * accumulation}) "
            f"over {world_size} workers) gives each worker {micro_batch} samples a batch"
        )
        if micro is not None and micro != micro_batch:
            raise ValueError(
                f"DeepSpeed config train_micro_batch_size_per_gpu={micro}, but {loader}; set it "
                "to 'auto' or make them agree"
            )
        if accumulation > 1 and accumulation != steps:
            raise ValueError(
                f"DeepSpeed's gradient_accumulation_steps is {steps}, but {loader} and "
                f"accumulates {accumulation} of them a step; set it to 'auto'"
            )
        micro = micro_batch
    elif micro is None:  # no loader yet: what the config implies, else a placeholder
        micro = train // (steps * world_size) if train is not None and train % (steps * world_size) == 0 else 1
    if train is not None and train != micro * steps * world_size:
        raise ValueError(
            f"DeepSpeed config train_batch_size={train}, but {micro} samples a batch x {steps} "
            f"accumulation steps x {world_size} workers make {micro * steps * world_size}; set "
            "train_batch_size to 'auto', prepare the loader with batch_size="
            f"{train // steps} (one batch for all workers), or set gradient_accumulation_steps "
            "to accumulate"
        )
    return {"train_batch_size": micro * steps * world_size, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": steps}


# torch's optimizers that update each element from its own gradient and state alone, so
# stepping them on ZeRO's flat partitions is exact; DeepSpeed lists only some as tested.
ELEMENTWISE = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
    torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.ASGD,
    torch.optim.Rprop,
)


def zero_sizes(numels: list[int], zero: dict[str, Any], *, stage: int) -> dict[str, int]:
    """Values for the ``ZERO_SIZES`` keys that ``zero`` (the config's zero_optimization)
    leaves ``"auto"``, or under ZeRO-3 leaves out: multiples of a block, the model's largest
    parameter or a 16th of the model, whichever is larger, never above DeepSpeed's default.
    So ZeRO-3 holds about two blocks gathered and buckets and steps one at a time."""
    if not numels:
        return {}
    block = max(max(numels), -(-sum(numels) // 16))
    return {
        key: min(default, times * block)
        for key, (default, times) in ZERO_SIZES.items()
        if zero.get(key) == "auto" or (key not in zero and stage == 3)
    }


def engine_config(
    options: DeepSpeed,
    batch: dict[str, int],
    *,
    client_cpu_optimizer: bool,
    elementwise: bool = False,
    numels: list[int] | None = None,
    max_grad_norm: float | None = None,
) -> dict[str, Any]:
    """The config ``deepspeed.initialize`` gets: the user's, with raylight's batch fields,
    the options' ZeRO settings (which the user's config already agrees with), ZeRO's sizes
    from the model's parameter sizes ``numels`` (``zero_sizes``), no gradient clipping
    unless it or ``ctx.prepare_optimizer(max_grad_norm=...)`` asks for some (the two must
    agree), and torch's elementwise optimizers (``ELEMENTWISE``, ``elementwise``) allowed."""
    config = copy.deepcopy(options.config_dict)
    config.update(batch)
    # DeepSpeed clips the gradient norm to 1.0 unless told otherwise; raylight's strategies
    # change how the model is held, not what it learns, so clipping is the loop's choice.
    if max_grad_norm is not None:
        theirs = config.get("gradient_clipping")
        if theirs not in (None, 0, 0.0, max_grad_norm):
            raise ConfigError(
                f"ctx.prepare_optimizer(max_grad_norm={max_grad_norm:g}) and the DeepSpeed config's "
                f"gradient_clipping={theirs} disagree: keep one of them"
            )
        config["gradient_clipping"] = max_grad_norm
    config.setdefault("gradient_clipping", 0.0)
    zero = config.setdefault("zero_optimization", {})
    zero["stage"] = options.stage
    zero.update(zero_sizes(numels or [], zero, stage=options.stage))
    for wanted, section in ((options.offload_optimizer, "offload_optimizer"), (options.offload_params, "offload_param")):
        if wanted and section not in zero:
            zero[section] = {"device": "cpu"}
    if elementwise:  # e.g. torch.optim.SGD, which DeepSpeed would refuse as untested
        config.setdefault("zero_allow_untested_optimizer", True)
    if options.offload_optimizer and not client_cpu_optimizer:
        # DeepSpeed refuses torch's optimizers on offloaded state unless told: they work,
        # DeepSpeedCPUAdam is faster (docs/strategies.md).
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    return config

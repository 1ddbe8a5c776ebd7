"""Fully sharded data parallel on PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each worker holds 1/N of every parameter (a ``DTensor`` sharded on dim 0), of its gradient
and of its optimizer state; a block's parameters are all-gathered for its forward and
backward and the gradients reduce-scattered. Works on CPUs (gloo) and GPUs (NCCL).

The user's loop stays the DDP one. Checkpoints are sharded by default: every rank writes
its shards with torch's distributed checkpoint, and loading reshards to the world size at
hand (``raylight.storage.sharded``). With ``FSDP(checkpoint="full")`` ``ctx.report`` gathers every
sharded tensor into a full state dict that rank 0 serialises, as DDP's are. Either way, a
full state dict loaded into the sharded model or the prepared optimizer is sharded again on
the way in (hooks registered here). So a checkpoint taken at one world size resumes at any
other, and under DDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from itertools import chain
from typing import Any

import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.config.schema import FSDP
from raylight.worker.strategies.base import (
    CheckpointFormat,
    ClipAtStep,
    backend_for,
    check_meta_resettable,
    keep_heap_small,
    load_objects,
    materialize,
    objects_state,
)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_shardable(
    model: nn.Module, options: FSDP, *, sharded: bool = True, setting: str = "scaling.strategy"
) -> None:
    """The mistakes that would stop ``fully_shard`` or the materialisation after it, found
    by reading the module tree (nothing allocated: a model on the meta device stays there):
    ``options.blocks`` naming no submodule class, a module owning meta tensors without
    ``reset_parameters()``, and, when the model is ``sharded`` (more than one worker, or
    mixed precision or CPU offload), a 0-dim parameter, which FSDP2 cannot shard (it cuts
    every parameter on dim 0). Each is a ``ConfigError`` naming the setting (``setting``:
    where the product's user sets the strategy) or the parameter, and the fix. The driver
    runs it where it sees the model (declarative, Lightning), every worker before sharding."""
    if options.blocks is not None:
        classes = {type(m).__name__ for m in model.modules() if m is not model}
        if not classes & set(options.blocks):
            raise ConfigError(
                f"{setting}.blocks {list(options.blocks)} names no submodule of "
                f"{type(model).__name__}; its submodule classes are {sorted(classes)}. Name the "
                "class of the layers to shard one by one (e.g. a transformer block), or leave "
                "blocks unset to shard by size (min_block_params)"
            )
    check_meta_resettable(model)
    if not sharded:
        return
    scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
    if scalars:
        shown = ", ".join(scalars[:5]) + (f" and {len(scalars) - 5} more" if len(scalars) > 5 else "")
        raise ConfigError(
            f"{setting} is FSDP, but the model's parameters {shown} are 0-dim (scalars), which FSDP2 "
            "cannot shard (it splits every parameter on dim 0). Make each a 1-element tensor "
            "(nn.Parameter(torch.ones(1)) instead of nn.Parameter(torch.tensor(1.0))), or register "
            "it as a buffer if it is not trained"
        )


def shard_blocks(model: nn.Module, options: FSDP) -> list[nn.Module]:
    """The submodules to shard one by one, innermost first (``fully_shard`` goes bottom-up).

    With ``options.blocks``, every submodule of one of those class names (``check_shardable``
    has made sure there is one); otherwise every submodule holding at least
    ``min_block_params`` parameters that no smaller block holds.
    """
    if options.blocks is not None:
        check_shardable(model, options, sharded=False)
        wanted = set(options.blocks)
        found = [m for m in model.modules() if m is not model and type(m).__name__ in wanted]
        return found[::-1]  # modules() is pre-order: reversed, children come before parents
    blocks: list[nn.Module] = []

    def left(module: nn.Module) -> int:  # parameters not yet in a block
        count = sum(p.numel() for p in module.parameters(recurse=False))
        count += sum(left(child) for child in module.children())
        if module is not model and count >= options.min_block_params:
            blocks.append(module)
            return 0
        return count

    left(model)
    return blocks


def _is_sharded(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _shard_like(value: torch.Tensor, param: Any) -> Any:
    """``value`` (the full tensor, the same on every rank) cut like ``param``: local, no
    communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    local, held = out.to_local(), param.to_local().device
    if local.device != held:  # distribute_tensor puts it on the mesh's device; an offloaded shard is in CPU memory
        out = DTensor.from_local(
            local.to(held), param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
        )
    return out


def _load_full_model_state(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """Pre-hook of ``load_state_dict``: full tensors for sharded parameters are sharded."""
    for name, param in chain(module.named_parameters(), module.named_buffers()):
        value = state_dict.get(prefix + name)
        if (
            _is_sharded(param)
            and isinstance(value, torch.Tensor)
            and not _is_sharded(value)
            and value.shape == param.shape
        ):
            state_dict[prefix + name] = _shard_like(value, param)


def _load_full_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Post-hook of the optimizer's ``load_state_dict``: a full state tensor of a sharded
    parameter (``exp_avg``, ``momentum_buffer``, ...) is sharded like the parameter."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state or not _is_sharded(param):
                continue
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and not _is_sharded(value)
                    and value.shape == param.shape
                ):
                    state[key] = _shard_like(value, param)


def _buffers_to(model: nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.device != device:
                module._buffers[name] = buffer.to(device)


def full_tensors(state: Any) -> Any:
    """``state`` with every DTensor gathered into a plain tensor in CPU memory (a collective
    per tensor, in the structure's order, which is the same on every rank). Each leaves the
    GPU as soon as it is gathered: a model that needed sharding may not fit there whole."""
    if _is_sharded(state):
        return state.full_tensor().cpu()
    if isinstance(state, dict):
        return {key: full_tensors(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(full_tensors(value) for value in state)
    return state


class FSDPStrategy:
    name = "fsdp"
    replicated = False
    # The device meshes and DTensors go with the loop's model; on CPU, DTensor's random ops
    # draw from the process's generator (its GPU tracker is never set: GPU workers are not
    # pooled); keep_heap_small's malloc settings stay, so the pool keys workers by strategy.
    reuses_process = True

    def __init__(self, options: FSDP | None = None) -> None:
        self.options = options or FSDP()
        self._clip: ClipAtStep | None = None  # the last optimizer prepared with max_grad_norm

    def backend(self, use_gpu: bool) -> str:
        return backend_for(use_gpu)

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        opts = self.options
        sharded = world_size > 1 or bool(opts.mixed_precision or opts.cpu_offload)
        check_shardable(model, opts, sharded=sharded)  # before anything is moved or sharded
        if not sharded:  # nothing to shard
            materialize(model, device=device, rank=rank)
            return model.to(device)
        # one worker with mixed precision or CPU offload still goes through fully_shard (a
        # mesh of one), which does both: it would otherwise train in full precision on the GPU
        if device.type == "cpu":
            keep_heap_small()
        if not any(t.is_meta for t in model.parameters()):
            model = model.to(device)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        dtype = _DTYPES.get(opts.mixed_precision) if opts.mixed_precision else None
        kwargs: dict[str, Any] = {
            "mesh": init_device_mesh(device.type, (world_size,)),
            "reshard_after_forward": opts.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype),
            "offload_policy": CPUOffloadPolicy() if opts.cpu_offload else OffloadPolicy(),
        }
        for block in shard_blocks(model, opts):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        offload = opts.cpu_offload and device.type != "cpu"
        # a meta-device model: only its shards; offloaded shards start in CPU memory, as
        # fully_shard's CPUOffloadPolicy requires, and the buffers (which FSDP leaves where
        # they are) go to the device the forward runs on
        materialize(model, device=torch.device("cpu") if offload else device, rank=rank)
        if offload:
            _buffers_to(model, device)
        model.register_load_state_dict_pre_hook(_load_full_model_state)
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard changes the module in place

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        optimizer.register_load_state_dict_post_hook(_load_full_optimizer_state)
        if max_grad_norm is not None:
            self._clip = ClipAtStep(optimizer, max_grad_norm)
        return optimizer

    def grad_norm(self) -> float | None:
        return self._clip.value if self._clip is not None else None

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        return _gradient_sync_off(model)

    def full_state(self, state: Any) -> Any:
        return full_tensors(state)

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        pass  # FSDP needs no batch settings

    def close(self) -> None:
        pass  # nothing beside the process group

    def sum_reducer(self) -> None:
        return None  # the process group's all-reduce

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        return "sharded" if world_size > 1 and self.options.checkpoint == "sharded" else "full"

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        return objects_state(objects)

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        load_objects(objects, state, full=full)


@contextlib.contextmanager
def _gradient_sync_off(model: nn.Module) -> Iterator[None]:
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is None:  # one worker: not sharded
        yield
        return
    setter(False)
    try:
        yield
    finally:
        setter(True)

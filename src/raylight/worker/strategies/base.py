"""What a data-parallel strategy is to raylight: the one interface the worker's
``TrainContext`` holds. One module per strategy; ``raylight.worker.strategies`` maps names to them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Literal, Protocol

import torch
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.worker.process_group import GPU_BACKEND

CheckpointFormat = Literal["full", "sharded"]


class Strategy(Protocol):
    """How a worker replicates or shards the model, and what a checkpoint of it is.

    A checkpoint is *full* (``full_state`` gathers every sharded tensor, a collective
    every rank joins, and rank 0 serialises it) or *sharded* (every rank writes its own
    shards with torch's distributed checkpoint); ``checkpoint_format`` says which. Either
    loads into any strategy at any world size: a full state dict through the wrapped
    model's or optimizer's own ``load_state_dict``, shards by resharding on load.

    Modules and optimizers may be put in a checkpoint as objects (``{"model": model,
    "opt": opt}``): ``objects_state`` gives their state dicts, keyed by parameter name
    (optimizer state too, so it survives a change of strategy), and ``load_objects`` puts
    a state back into them.
    """

    name: str
    # Whether each rank holds the whole, unreduced gradient of its own micro-batch before
    # it is reduced (DDP). When False (sharded gradients), adaptive training measures the
    # gradient noise on the reduced gradients, as with one replica.
    replicated: bool
    # Whether a worker process that ran a loop under this strategy can run the next run's
    # loop (raylight.worker_group.pool): True only where the strategy keeps no process-wide
    # state past its process group (FSDP's device meshes and DeepSpeed's communication
    # globals outlive it).
    reuses_process: bool

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        """``sharded`` when the workers write their shards themselves, else ``full``."""
        ...

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        """The state dict of each module and optimizer in ``objects`` (keys kept), as this
        worker holds it (sharded tensors stay sharded). Every rank calls it."""
        ...

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        """Load ``state`` (what ``objects_state`` gave, possibly from another world size or
        strategy) into ``objects``; ``full``: its tensors are whole, not this rank's shards."""
        ...

    def backend(self, use_gpu: bool) -> str:
        """The ``torch.distributed`` backend: ``gloo`` on CPUs; on GPUs NCCL for CUDA tensors
        and gloo for CPU ones (``GPU_BACKEND``)."""
        ...

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        """Move ``model`` to ``device`` and wrap (or shard) it for ``world_size`` workers."""
        ...

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The user's module inside what ``wrap_model`` returned."""
        ...

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        """The optimizer the loop steps (built on the wrapped model's parameters).
        ``adaptive``: raylight's ``AdaptiveOptimizer`` will wrap it and decide when a step
        ends (accumulation), so an engine that counts micro-steps itself (DeepSpeed)
        must step when told instead. ``max_grad_norm``: clip the gradient each step
        applies (reduced over the ranks, accumulated micro-steps averaged) to that total
        norm, right before the step."""
        ...

    def grad_norm(self) -> float | None:
        """The total norm of the gradient the last optimizer step applied, before any
        clipping, where the strategy knows it (it clips: ``max_grad_norm``; or its engine
        computes it), else None."""
        ...

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        """Skip the gradient reduction of ``model``'s backward (gradient accumulation)."""
        ...

    def full_state(self, state: Any) -> Any:
        """``state`` (nested dicts, lists, tensors) with every sharded tensor gathered into
        a plain one. Every rank calls it with the same structure."""
        ...

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        """The training loader's layout: each batch it yields holds ``micro_batch``
        samples per worker, and ``accumulation`` of them make one optimizer step (1 without
        an accumulating adaptive plan). ``TrainContext.prepare_loader`` tells it, and in
        adaptive and elastic runs the loader before every optimizer step; a strategy whose
        engine needs the batch (DeepSpeed's batch fields) keeps it, DDP and FSDP ignore it."""
        ...

    def close(self) -> None:
        """Release what the strategy started beside the process group (Horovod's
        background thread and rendezvous server, DDP's shared memory), once the loop has
        ended and before the group is destroyed. Every rank calls it; FSDP and DeepSpeed
        have nothing to release."""
        ...

    def sum_reducer(self) -> Callable[[torch.Tensor], Any] | None:
        """An in-place sum over the run's group that every rank can use in place of
        ``dist.all_reduce`` and that is faster for small tensors (DDP's shared memory on
        CPU, ``shm_allreduce``), or None. Adaptive training's control all-reduces use it."""
        ...


class ClipAtStep:
    """Clips the gradients ``optimizer`` steps on to a total norm, right before each of its
    steps (a step pre-hook: after DDP's all-reduce, after an adaptive step's micro-steps
    are summed and averaged, on the whole of FSDP's sharded gradient), and keeps the norm
    it found (``value``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        self.max_norm = max_norm
        self._norm: torch.Tensor | None = None
        optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        full_tensor = getattr(norm, "full_tensor", None)  # FSDP: a DTensor of the shards' partial norms
        norm = full_tensor() if callable(full_tensor) else norm
        torch.nn.utils.clip_grads_with_norm_(params, self.max_norm, norm)
        self._norm = norm

    @property
    def value(self) -> float | None:
        """The last step's norm before clipping (None before the first step)."""
        return None if self._norm is None else float(self._norm)


def backend_for(use_gpu: bool) -> str:
    return GPU_BACKEND if use_gpu else "gloo"


def no_sync_of(model: nn.Module) -> ContextManager[None]:
    """``model.no_sync()`` where the wrapper has one, else nothing to skip."""
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()


def _root(objects: dict[str, Any]) -> tuple[nn.Module, dict[str, nn.Module], dict[str, torch.optim.Optimizer]]:
    """The modules of ``objects`` under one ``ModuleDict`` (parameter names become
    ``<key>.<name>``, so an optimizer's state is keyed by the names of the parameters it
    optimizes), the modules and the optimizers."""
    modules = {k: v for k, v in objects.items() if isinstance(v, nn.Module)}
    optimizers = {k: v for k, v in objects.items() if isinstance(v, torch.optim.Optimizer)}
    for key in modules:
        if not key or "." in key:
            raise ValueError(
                f"checkpoint key {key!r} holds a module: its name must be non-empty and "
                "without '.' (it prefixes the module's parameter names)"
            )
    if optimizers and not modules:
        raise ValueError(
            f"checkpoint entries {sorted(optimizers)} are optimizers: put the model whose "
            "parameters they optimize in the same checkpoint (e.g. {'model': model, 'opt': opt}), "
            "so their state is keyed by parameter name"
        )
    return nn.ModuleDict(modules), modules, optimizers


def objects_state(objects: dict[str, Any], *, full: bool = False) -> dict[str, Any]:
    """``Strategy.objects_state`` on torch's state-dict helpers (DDP and FSDP wrappers are
    seen through; ``full``: sharded tensors gathered)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    root, modules, optimizers = _root(objects)
    options = StateDictOptions(full_state_dict=full)
    out: dict[str, Any] = {key: {} for key in modules}
    if modules:
        for name, value in get_model_state_dict(root, options=options).items():
            key, rest = name.split(".", 1)
            out[key][rest] = value
    for key, optimizer in optimizers.items():
        out[key] = get_optimizer_state_dict(root, optimizer, options=options)
    return out


def load_objects(objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
    """``Strategy.load_objects`` on torch's state-dict helpers."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    root, modules, optimizers = _root(objects)
    options = StateDictOptions(full_state_dict=full)
    if modules:
        merged = {f"{key}.{name}": value for key in modules for name, value in state[key].items()}
        set_model_state_dict(root, merged, options=options)
    for key, optimizer in optimizers.items():
        # An optimizer without tensor state (plain SGD) has nothing to shard; torch's
        # full-state path needs a tensor to find the device (torch 2.13).
        whole = full and any(isinstance(v, torch.Tensor) for s in state[key].get("state", {}).values() for v in s.values())
        set_optimizer_state_dict(root, optimizer, state[key], options=StateDictOptions(full_state_dict=whole))


def meta_owners(model: nn.Module) -> list[nn.Module]:
    """The modules that own a tensor on the meta device (their own, not their children's)."""
    return [
        m for m in model.modules()
        if any(t.is_meta for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))
    ]


def check_meta_resettable(model: nn.Module) -> None:
    """A model built on the meta device can be given storage only where every module owning
    a meta tensor has ``reset_parameters()``: a ``ConfigError`` naming the modules (by their
    path in the model) otherwise. Reads the module tree only; allocates nothing."""
    owners = {id(m) for m in meta_owners(model)}
    if not owners:
        return
    missing = [
        (name or "(the model itself)", type(m).__name__)
        for name, m in model.named_modules()
        if id(m) in owners and not callable(getattr(m, "reset_parameters", None))
    ]
    if missing:
        classes = sorted({cls for _, cls in missing})
        where = ", ".join(f"{name} ({cls})" for name, cls in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(
            f"the model was built on the meta device, but {classes} have no reset_parameters() to "
            f"initialise their tensors with (modules {where}); give them one, or build the model on "
            "a real device"
        )


def materialize(
    model: nn.Module, *, device: torch.device, rank: int, each: Callable[[nn.Module], None] | None = None
) -> None:
    """Give a model built on the ``meta`` device (no memory) real storage on ``device``
    and initialise it with each module's ``reset_parameters()``. Called after sharding, so
    each worker only ever allocates its shards. On CPU, torch's DTensor random ops draw
    every shard from the worker's own generator, so the generator is seeded per rank
    (the same distribution as a full initialisation, not the same numbers); the caller's
    random state is left as it was.

    With ``each``, modules are materialised one at a time, every module after the modules
    inside it, and ``each(module)`` is called as soon as one is (ZeRO-3 partitions it there,
    so a worker never holds more than one module's whole tensors)."""
    tensors = [*model.parameters(), *model.buffers()]
    if not any(t.is_meta for t in tensors):
        return
    owners = meta_owners(model)
    check_meta_resettable(model)
    resets = [getattr(m, "reset_parameters", None) for m in owners]
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        if device.type == "cpu":
            torch.manual_seed(torch.initial_seed() + rank)
        if each is None:
            model.to_empty(device=device)
            for reset in resets:
                reset()  # type: ignore[misc]  # callable, checked above
            return
        for module, reset in reversed(list(zip(owners, resets, strict=True))):
            module.to_empty(device=device, recurse=False)
            reset()
            each(module)


# glibc reads its tunables when a process starts: the worker group starts the workers of a
# sharded run on CPU with this. Transparent huge pages for malloc's own mappings make the
# page faults of keep_heap_small's per-allocation mappings 512x fewer: measured on a 50 M-
# parameter MLP, FSDP2 with 2 CPU workers stepped in 649 ms with glibc's defaults (peak
# 1737 MiB), 1523 ms with keep_heap_small alone (747 MiB), 789 ms with both (755 MiB).
HEAP_TUNABLES = "glibc.malloc.hugetlb=1"


def worker_env(strategy_name: str, use_gpu: bool, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Environment variables the workers of a run start with: ``GLIBC_TUNABLES`` for a
    sharded strategy on CPU, unless the driver's environment sets its own."""
    if use_gpu or strategy_name == "ddp" or "GLIBC_TUNABLES" in environ:
        return {}
    return {"GLIBC_TUNABLES": HEAP_TUNABLES}


def keep_heap_small() -> None:
    """On glibc, serve every allocation of 1 MiB or more with its own mapping, returned to
    the system when freed. glibc's default threshold grows with the largest block freed, so
    a sharded strategy's per-block all-gather buffers (freed each step) end up in the heap,
    which never shrinks: measured on a 25 M-parameter MLP with 2 CPU workers, FSDP's
    resident memory after 6 steps was 826 MiB with the default, 285 MiB with this (DDP's:
    570-700 MiB). Large allocations then cost a page fault each, which slowed DDP's steps
    by ~15% in the same measurement, so only sharded strategies on CPU ask for it."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return
    m_mmap_threshold = -3
    mallopt(m_mmap_threshold, 1 << 20)
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)

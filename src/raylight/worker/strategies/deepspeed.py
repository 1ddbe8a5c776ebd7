"""DeepSpeed ZeRO (stages 1-3, optimizer and parameter offload) behind raylight's
``Strategy``; the extra ``deepspeed``, imported when the first model is prepared.

**When the engine is built.** ``deepspeed.initialize`` needs the model, the optimizer and
the batch settings together, while the loop prepares them one at a time (the README's
order: model, then an optimizer on its parameters, then the loader). ``prepare_model``
returns a ``DeepSpeedModel`` holding the user's module; ``prepare_optimizer`` builds the
engine from both and returns a ``DeepSpeedOptimizer``. From then on the model's forward
runs through the engine, which hooks its output, so the DDP loop trains unchanged:
``loss.backward()`` reduces (and with ZeRO-2/3 partitions) the gradients, ``opt.step()``
is ``engine.step()``. ``model.backward(loss)`` and ``model.step()`` (DeepSpeed's own
calls) work too; use one style per step, not both.

**The batch.** The engine is built before the loader exists.
``gradient_accumulation_steps``, the one batch field that changes the training, is fixed
then (DeepSpeed's ZeRO optimizers keep their own copy): the config's number, or what its
train and micro batch sizes imply, else 1. ``prepare_loader`` then tells the strategy its
layout (``Strategy.set_batch_layout``, the one addition to the protocol; DDP and FSDP
ignore it), and the other two fields are filled or checked (``resolve_batch``) and set
with DeepSpeed's public ``set_train_micro_batch_size``.

**Accumulation.** DeepSpeed counts micro-steps itself: the loop calls ``opt.step()``
after every batch and the engine steps the optimizer on every
``gradient_accumulation_steps``-th, averaging the gradients; ``opt.zero_grad()`` is a
no-op in between. ``no_sync`` is therefore nothing here (DeepSpeed's own ``no_sync`` is
illegal with ZeRO-2/3): when raylight's loader runs accumulation micro-steps under
``ctx``'s ``no_sync``, DeepSpeed's count agrees with the loader's as long as both say the
same number of micro-steps (``resolve_batch`` insists).

**Checkpoints** are torch's layouts (``objects_state``): model state keyed by parameter
name, optimizer state as ``get_optimizer_state_dict`` gives it, so a DeepSpeed checkpoint
loads under DDP and FSDP and theirs load here. Each parameter's full fp32 value and
optimizer moments are gathered one parameter at a time (DeepSpeed's public
``safe_get_full_*`` helpers, collectives) and this rank keeps its ``Shard(0)`` slice as a
``DTensor``: DCP writes 1/N per rank and reshards on load, and a worker holds about one
full parameter more than its shards while it does. Loading gathers each parameter back
and sets it (``safe_set_full_*``; ZeRO-3's partitions through its ``safe_set_local_*``
helpers, cut the way ZeRO-3 partitions). A fresh engine has no optimizer state until its
first step, so before the first load (or checkpoint) it takes one step with zero
gradients at learning rate 0 and then resets the step counters, as torch's
``_init_optim_state`` does for DDP and FSDP.

Raw state dicts: under ZeRO-1/2 the module holds its whole parameters, so
``ctx.unwrap_model(model).state_dict()`` is the model (and loading one is pushed into
DeepSpeed's fp32 master weights); ``opt.state_dict()`` gathers the whole optimizer state
in torch's layout (a collective). Under ZeRO-3 the module's parameters are partitioned
placeholders, so its ``state_dict()`` and ``load_state_dict()`` raise, naming the object
way (``checkpoint={"model": model, "opt": opt}``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raylight.base.exceptions import ConfigError
from raylight.config.schema import DEEPSPEED_BATCH_KEYS, ZERO_SIZES, DeepSpeed
from raylight.worker.strategies.base import (
    CheckpointFormat,
    _root,
    backend_for,
    keep_heap_small,
    materialize,
)
from raylight.worker.strategies.base import load_objects as torch_load_objects
from raylight.worker.strategies.base import objects_state as torch_objects_state
from raylight.worker.strategies.fsdp import full_tensors
from raylight.worker.wrapped_optimizer import WrappedOptimizer

INSTALL = "pip install 'raylight[deepspeed]'"
_ZERO3_OBJECTS = (
    "DeepSpeed ZeRO-3 partitions the parameters, so the module's state_dict() would hold "
    "empty placeholders: put the objects in the checkpoint instead, "
    "ctx.report(metrics, checkpoint={'model': model, 'opt': opt}), and load them with "
    "ctx.load_checkpoint({'model': model, 'opt': opt})"
)


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


def import_deepspeed() -> Any:
    """``import deepspeed``, without mlflow where this process has not imported it yet:
    DeepSpeed's autotuner imports mlflow when it can, only to log its own tuning runs
    (which raylight never starts), and that is most of the import's time where mlflow is
    installed (1.2 s against 0.26 s after torch, on this project's 2-core machine). Every
    worker of a DeepSpeed run pays the import, and sharded workers are not reused. An
    ``import mlflow`` later (raylight's MLflow logger, your loop) works as usual."""
    hide = "deepspeed" not in sys.modules and "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # import mlflow: ImportError
    try:
        import deepspeed
    finally:
        if hide and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed


def release_process_group() -> bool:
    """Destroy the run's process group in a process where DeepSpeed ran, as a new process
    finds it: through ``deepspeed.comm``, which then drops its own references to the group
    and the subgroups it made (``deepspeed.utils.groups``), and with DeepSpeed's
    communication backend dropped too (built for this run's rank and world size; the next
    run's ``deepspeed.initialize`` builds its own). False where this DeepSpeed cannot drop
    its references (the group is destroyed all the same, and the process is not reused).
    Garbage that holds the group goes first, as in ``launcher_env.destroy_process_group``."""
    import deepspeed.comm
    from deepspeed.comm import comm
    from deepspeed.utils import groups

    from raylight.worker.process_group import destroy_process_group

    if not hasattr(groups, "_release_process_group_references"):  # DeepSpeed before it had one
        destroy_process_group()
        return False
    gc.collect()
    deepspeed.comm.destroy_process_group()
    comm.cdb = None
    return True


def holds_process_groups() -> bool:
    """Whether DeepSpeed, if this process imported it, still holds a run's process group."""
    comm = sys.modules.get("deepspeed.comm.comm")
    return comm is not None and getattr(comm, "cdb", None) is not None


def skip_shm_comm() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce when its communication
    backend starts (``deepspeed.comm``'s ``TorchBackend``, on the CPU accelerator): a C++
    extension compiled on first use (27 s, 47 CPU-s on this project's 2-core machine, and
    a compiler on every node) for ``inference_all_reduce`` alone, which training never
    calls: its collectives are torch.distributed's over raylight's process group. DeepSpeed
    keeps edits to ``deepspeed.ops.__compatible_ops__``; marked incompatible, the op is not
    built (the same as on a machine without a compiler). Call before the backend starts."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


# torch 2.13 deprecated two collectives DeepSpeed's ZeRO calls at every step; each rank
# then prints a FutureWarning addressed to DeepSpeed's authors, and Ray repeats it to the
# driver. The user's own calls to them are silenced too in that worker (the same message).
_DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"


def quiet_deprecated_collectives() -> None:
    """Hide torch's deprecation warning of the collectives DeepSpeed calls, in this process."""
    warnings.filterwarnings("ignore", message=_DEPRECATED_COLLECTIVES, category=FutureWarning)


def _import_deepspeed(device: torch.device) -> Any:
    """DeepSpeed, with its accelerator matching ``device``: DeepSpeed picks it when first
    imported (``DS_ACCELERATOR``), and takes its device index from ``LOCAL_RANK``."""
    wanted = "cpu" if device.type == "cpu" else "cuda"
    if "deepspeed" not in sys.modules:
        os.environ["DS_ACCELERATOR"] = wanted
    if device.type == "cuda":  # DeepSpeed sets its device from LOCAL_RANK: this worker's
        os.environ["LOCAL_RANK"] = str(device.index or 0)
    try:
        deepspeed = import_deepspeed()
        from deepspeed.accelerator import get_accelerator
    except ImportError as exc:
        raise ImportError(f"strategy 'deepspeed' needs DeepSpeed: {INSTALL} ({exc})") from exc
    name = get_accelerator().device_name()
    skip_shm_comm()
    quiet_deprecated_collectives()
    if name != wanted:
        raise RuntimeError(
            f"DeepSpeed was imported in this process for {name!r}, but this worker trains on "
            f"{device}; import deepspeed only inside the training loop (or set DS_ACCELERATOR)"
        )
    return deepspeed


class DeepSpeedModel(nn.Module):
    """What ``ctx.prepare_model`` returns: the user's module (``.module``), trained
    through the DeepSpeed engine (``.engine``, built by ``ctx.prepare_optimizer``)."""

    def __init__(self, module: nn.Module, strategy: DeepSpeedStrategy) -> None:
        super().__init__()
        self.module = module
        self._strategy = strategy

    @property
    def engine(self) -> Any:
        return self._strategy.engine()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.engine()(*args, **kwargs)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> Any:
        """DeepSpeed's ``engine.backward(loss)`` (instead of ``loss.backward()``)."""
        return self._strategy.engine().backward(loss, **kwargs)

    def step(self) -> None:
        """DeepSpeed's ``engine.step()``, the same as the prepared optimizer's ``step()``."""
        self._strategy.engine().step()


class DeepSpeedOptimizer(WrappedOptimizer):
    """What ``ctx.prepare_optimizer`` returns under DeepSpeed (a ``WrappedOptimizer``:
    torch's LR schedulers and raylight's checkpoints take it): ``param_groups`` and
    ``state`` are the user's optimizer's, which DeepSpeed steps on its flat fp32
    partitions; ``step`` is the engine's."""

    _raylight_deepspeed = True  # read by bench/strategies.py: its state is not per parameter

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: DeepSpeedStrategy) -> None:
        super().__init__(optimizer)
        self._strategy = strategy

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise ValueError(
            "strategy 'deepspeed': add parameter groups to the optimizer before ctx.prepare_optimizer "
            "(DeepSpeed's engine is built from them)"
        )

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._strategy.engine().step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """DeepSpeed clears the gradients after each optimizer step; between the micro-steps
        of an accumulation this does nothing, so the DDP loop's ``zero_grad`` keeps them
        (adaptive runs: ``AdaptiveOptimizer`` calls it only before a step's first one)."""
        engine = self._strategy.engine()
        if self._strategy.caller_steps or engine.micro_steps % engine.gradient_accumulation_steps() == 0:
            engine.zero_grad()

    # -- adaptive training (raylight.worker.adaptive.optimizer.EngineGradients) ----------
    def on_local_gradient(self, hook: Callable[[torch.Tensor], None]) -> None:
        """Call ``hook`` with each parameter's gradient of each backward, this rank's own,
        before DeepSpeed reduces it (divided by the step's micro-step count, as DeepSpeed
        divides every backward)."""
        module = self._strategy.unwrap_model(self._strategy.engine())
        for param in module.parameters():
            if param.requires_grad:
                param.register_hook(hook)  # it returns None: the gradient is left as it is

    def reduced_sqr_norm(self) -> float | None:
        """The squared norm of the gradient the last step applied (reduced over the ranks
        and averaged over its micro-steps), as DeepSpeed computed it; None where it does not
        (zero_optimization.compute_grad_norm false)."""
        norm = self._strategy.engine().get_global_grad_norm()
        return None if norm is None else float(norm) ** 2

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state in torch's layout (parameters numbered in group
        order). A collective: every rank calls it."""
        return self._strategy.optimizer_state(numbered=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._strategy.load_optimizer_state(state_dict, numbered=True)


class DeepSpeedStrategy:
    name = "deepspeed"
    replicated = False  # gradients are reduced (ZeRO-2/3: partitioned) by the engine
    reuses_process = True  # the worker tears its groups down through deepspeed.comm (release_process_group)

    def __init__(self, options: DeepSpeed | None = None) -> None:
        self.options = options or DeepSpeed()
        self._device = torch.device("cpu")
        self._world_size = 1
        self._module: nn.Module | None = None
        self._model: DeepSpeedModel | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._prepared: DeepSpeedOptimizer | None = None
        self._engine: Any = None
        self._groups: list[list[str]] = []  # parameter names of each param group
        self._layout: tuple[int, int] | None = None  # (micro_batch, accumulation)
        self._raw_state_ok = False
        self._ds: Any = None
        self._mesh: Any = None
        self._numels: list[int] = []  # the model's parameter sizes (zero_sizes)
        # adaptive runs: raylight's AdaptiveOptimizer ends each step (DeepSpeed's
        # managed_gradient_accumulation off) and the loader sets each step's accumulation
        self.caller_steps = False

    # -- the protocol ----------------------------------------------------------------
    def backend(self, use_gpu: bool) -> str:
        return backend_for(use_gpu)

    def wrap_model(self, model: nn.Module, *, device: torch.device, world_size: int) -> nn.Module:
        if self._model is not None:
            raise RuntimeError(
                "strategy 'deepspeed' trains one model (one DeepSpeed engine); ctx.prepare_model "
                "was called twice"
            )
        if not dist.is_initialized():
            raise RuntimeError("strategy 'deepspeed' needs torch.distributed, which this process has not initialised")
        os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))  # raylight's workers set it
        self._ds = _import_deepspeed(device)
        self._device, self._world_size = device, world_size
        self._numels = [int(getattr(p, "ds_numel", p.numel())) for p in model.parameters()]
        if device.type == "cpu" and self.options.stage == 3 and world_size > 1:
            keep_heap_small()  # ZeRO-3 gathers and frees parameters module by module
        # A meta-device model is initialised on each rank, then DeepSpeed broadcasts rank
        # 0's parameters: under ZeRO-3 module by module, each partitioned as soon as it is
        # (deepspeed.zero.Init on the module), so no worker ever holds the whole model;
        # under ZeRO-1/2 when the engine is built.
        each = None
        if self.options.stage == 3 and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            # zero.Init broadcasts and reads the world size through deepspeed.comm, which
            # deepspeed.initialize would set up later (over the same process group)
            self._ds.init_distributed(dist_backend=dist.get_backend())
            config = engine_config(self.options, self._resolve(), client_cpu_optimizer=False, numels=self._numels)
            each = functools.partial(self._partition, config=config)
        materialize(model, device=device, rank=0, each=each)
        self._module = model.to(device)
        self._model = DeepSpeedModel(self._module, self)
        return self._model

    def _partition(self, module: nn.Module, *, config: dict[str, Any]) -> None:
        """ZeRO-3: partition ``module``'s parameters now (broadcast from rank 0, then each
        rank keeps its partition), as ``deepspeed.zero.Init`` does to a module built in it."""
        self._ds.zero.Init(module=module, config_dict_or_path=config)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        if isinstance(model, DeepSpeedModel) or (self._engine is not None and model is self._engine):
            inner: nn.Module = model.module
            return inner
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, *, adaptive: bool = False, max_grad_norm: float | None = None
    ) -> torch.optim.Optimizer:
        if self._module is None:
            raise RuntimeError("strategy 'deepspeed': call ctx.prepare_model(model) before ctx.prepare_optimizer(opt)")
        if self._engine is not None:
            raise RuntimeError("strategy 'deepspeed' trains one optimizer (one DeepSpeed engine); ctx.prepare_optimizer was called twice")
        if isinstance(optimizer, DeepSpeedOptimizer):
            raise TypeError("this optimizer was already prepared with ctx.prepare_optimizer")
        names = {id(p): n for n, p in self._module.named_parameters()}
        self._groups = [[names[id(p)] for p in g["params"] if id(p) in names] for g in optimizer.param_groups if g["params"]]
        if sum(map(len, self._groups)) != sum(len(g["params"]) for g in optimizer.param_groups):
            raise ValueError(
                "the optimizer holds parameters that are not the prepared model's: build it on "
                "model.parameters() after ctx.prepare_model(model)"
            )
        self._optimizer = optimizer
        self.caller_steps = adaptive
        self._engine = self._build_engine(optimizer, max_grad_norm)
        self._prepared = DeepSpeedOptimizer(optimizer, self)
        self._register_state_dict_hooks(self._module)
        return self._prepared

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        return contextlib.nullcontext()  # DeepSpeed counts micro-steps itself (module docstring)

    def full_state(self, state: Any) -> Any:
        return full_tensors(state)

    def close(self) -> None:
        pass  # the engine goes with the loop; the worker releases deepspeed.comm's state

    def sum_reducer(self) -> None:
        return None  # the process group's all-reduce

    def grad_norm(self) -> float | None:
        """DeepSpeed's norm of the last step's gradient (before its clipping), None before
        the engine exists or where it computes none."""
        norm = self._engine.get_global_grad_norm() if self._engine is not None else None
        return None if norm is None else float(norm)

    def set_batch_layout(self, *, micro_batch: int, accumulation: int) -> None:
        self._layout = (micro_batch, accumulation)
        if self._engine is None:
            return
        if self.caller_steps:  # this step's layout: DeepSpeed divides each backward by its accumulation
            engine = self._engine
            if (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()) != (micro_batch, accumulation):
                engine.set_train_micro_batch_size(micro_batch)
                engine.set_train_batch_size(micro_batch * engine.dp_world_size * accumulation)
            return
        batch = self._resolve()
        # Keeps gradient_accumulation_steps: it was fixed when the engine was built.
        self._engine.set_train_micro_batch_size(batch["train_micro_batch_size_per_gpu"])

    def checkpoint_format(self, world_size: int) -> CheckpointFormat:
        return "sharded" if world_size > 1 and self.options.checkpoint == "sharded" else "full"

    def objects_state(self, objects: dict[str, Any]) -> dict[str, Any]:
        ours, others, model_key = self._split(objects)
        if ours and not self.caller_steps:  # (adaptive runs report between raylight's steps)
            engine = self._engine
            done = engine.micro_steps % engine.gradient_accumulation_steps()
            if done:
                raise RuntimeError(
                    f"a DeepSpeed checkpoint was taken {done} micro-steps into an accumulation of "
                    f"{engine.gradient_accumulation_steps()}: its gradients so far would be lost; "
                    "report checkpoints right after the opt.step() that ends an accumulation "
                    "(every gradient_accumulation_steps batches)"
                )
        out = torch_objects_state(others) if others else {}
        for key, value in ours.items():
            if isinstance(value, nn.Module):
                out[key] = self._model_state(self._shard)
            else:
                out[key] = self.optimizer_state(prefix=f"{model_key}.", cut=self._shard)
        return out

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        ours, others, model_key = self._split(objects)
        if others:
            torch_load_objects(others, state, full=full)
        for key, value in ours.items():
            if isinstance(value, nn.Module):
                self._load_model_state(state[key], name=key)
            else:
                self.load_optimizer_state(state[key], prefix=f"{model_key}.")

    # -- the engine ------------------------------------------------------------------
    def engine(self) -> Any:
        if self._engine is None:
            raise RuntimeError(
                "the DeepSpeed engine is built by ctx.prepare_optimizer(opt): build the optimizer "
                "on model.parameters() and prepare it before the model's first forward"
            )
        return self._engine

    def _resolve(self) -> dict[str, int]:
        given = self.options.config_dict
        micro, accumulation = self._layout if self._layout is not None else (None, 1)
        steps = (
            self._engine.gradient_accumulation_steps()
            if self._engine is not None
            else accumulation_steps(given, world_size=self._world_size)
        )
        return resolve_batch(
            given, world_size=self._world_size, steps=steps, micro_batch=micro, accumulation=accumulation
        )

    def _build_engine(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None) -> Any:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.lion import DeepSpeedCPULion

        cpu = isinstance(optimizer, DeepSpeedCPUAdam | DeepSpeedCPULion)
        config = engine_config(
            self.options, self._resolve(), client_cpu_optimizer=cpu, elementwise=type(optimizer) in ELEMENTWISE,
            numels=self._numels, max_grad_norm=max_grad_norm,
        )
        if self.caller_steps:
            if not hasattr(self._ds.DeepSpeedEngine, "managed_gradient_accumulation"):
                raise RuntimeError(
                    f"adaptive training with strategy 'deepspeed' needs DeepSpeed >= 0.19 (its "
                    f"managed_gradient_accumulation setting); this worker has {self._ds.__version__}: {INSTALL} -U"
                )
            if config["zero_optimization"].get("compute_grad_norm") is False:
                raise ValueError(
                    "adaptive training measures the gradient noise from DeepSpeed's gradient norm: "
                    "remove zero_optimization.compute_grad_norm=false from the DeepSpeed config"
                )
            config["managed_gradient_accumulation"] = False  # AdaptiveOptimizer ends each step
        engine, _, _, _ = self._ds.initialize(model=self._module, optimizer=optimizer, config=config)
        return engine

    # -- state, one parameter at a time ------------------------------------------------
    def _split(self, objects: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
        """This engine's model and optimizer among ``objects`` (by key), the others, and
        the key of the model (it prefixes the optimizer's parameter names)."""
        _root(objects)  # the keys' checks
        mine = (self._model, self._module, self._engine, self._prepared, self._optimizer)
        ours = {k: v for k, v in objects.items() if any(v is m for m in mine if m is not None)}
        others = {k: v for k, v in objects.items() if k not in ours}
        model_keys = [k for k, v in ours.items() if isinstance(v, nn.Module)]
        if any(isinstance(v, torch.optim.Optimizer) for v in ours.values()) and not model_keys:
            raise ValueError(
                "the checkpoint holds the DeepSpeed optimizer without its model: put both in it "
                "(e.g. {'model': model, 'opt': opt}), so the optimizer's state is keyed by parameter name"
            )
        if ours and self._engine is None:
            raise RuntimeError("strategy 'deepspeed': prepare the optimizer (ctx.prepare_optimizer) before checkpointing or loading the model")
        return ours, others, (model_keys[0] if model_keys else "")

    def _zero3(self, param: torch.Tensor) -> bool:
        return hasattr(param, "ds_id")  # the mark DeepSpeed's safe_* helpers test too

    def _entries(self) -> dict[str, torch.Tensor]:
        """The module's state-dict entries (parameters as themselves), placeholders and all."""
        assert self._module is not None
        self._raw_state_ok = True
        try:
            return self._module.state_dict(keep_vars=True)
        finally:
            self._raw_state_ok = False

    def _full_param(self, param: torch.Tensor) -> torch.Tensor:
        from deepspeed.utils import safe_get_full_fp32_param

        value = safe_get_full_fp32_param(param)
        if value is None:  # not optimized (frozen): the module's own value
            with self._gathered([param]):
                value = param.detach().clone()
        return value

    def _gathered(self, params: list[torch.Tensor], modifier_rank: int | None = None) -> ContextManager[Any]:
        if any(self._zero3(p) for p in params):
            return self._ds.zero.GatheredParameters(params, modifier_rank=modifier_rank)
        return contextlib.nullcontext()

    def _shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's ``Shard(0)`` slice of ``full`` as a DTensor (a copy: ``full`` can
        be freed); scalars, and everything at world size 1, stay plain."""
        full = full.to(self._device)
        if self._world_size == 1 or full.dim() == 0:
            return full
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor

        if self._mesh is None:
            self._mesh = init_device_mesh(self._device.type, (self._world_size,))
        local = distribute_tensor(full, self._mesh, [Shard(0)], src_data_rank=None).to_local().clone()
        return DTensor.from_local(local, self._mesh, [Shard(0)], run_check=False, shape=full.shape, stride=full.stride())

    def _model_state(self, cut: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, value in self._entries().items():
            if isinstance(value, nn.Parameter):
                out[name] = cut(self._full_param(value))
            else:  # buffers: whole on every rank
                out[name] = value.detach().clone()
        return out

    def _load_model_state(self, state: dict[str, Any], *, name: str) -> None:
        entries = self._entries()
        missing, unexpected = sorted(set(entries) - set(state)), sorted(set(state) - set(entries))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint entry {name!r} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        seen: set[int] = set()
        with torch.no_grad():
            for key, target in entries.items():
                if id(target) in seen:
                    continue  # a tied parameter, set under its first name
                seen.add(id(target))
                value = _whole(state[key])
                if isinstance(target, nn.Parameter):
                    self._set_param(target, value)
                else:
                    target.copy_(value)

    def _set_param(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Set the fp32 master copy (what the optimizer steps) and the module's parameter."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_local_fp32_param

        if param.requires_grad and self._zero3(param):
            safe_set_local_fp32_param(param, self._local(param, value))
        elif param.requires_grad:
            safe_set_full_fp32_param(param, value.to(self._device))
        with self._gathered([param], modifier_rank=0):
            if not self._zero3(param) or dist.get_rank() == 0:
                param.data.copy_(value)

    def _local(self, param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """ZeRO-3's partition of ``value`` on this rank: equal parts of the flattened
        tensor, zero-padded at the end, in rank order (DeepSpeed's
        ``safe_set_full_fp32_param`` mishandles the padding, so we cut it ourselves)."""
        from deepspeed.utils import safe_get_local_fp32_param

        size = safe_get_local_fp32_param(param).numel()
        flat = value.reshape(-1).to(self._device, torch.float32)
        flat = torch.cat([flat, flat.new_zeros(size * self._world_size - flat.numel())])
        rank = dist.get_rank()
        return flat[rank * size : (rank + 1) * size].clone()

    def _optimized(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, parameter) of every parameter the optimizer steps, in group order."""
        assert self._module is not None
        params = dict(self._module.named_parameters())
        for group in self._groups:
            for name in group:
                yield name, params[name]

    def _state_keys(self) -> tuple[list[str], dict[str, Any]]:
        """The optimizer's per-element state keys (``exp_avg``, ...) and its per-group
        values (``step``), read from its flat partitions."""
        assert self._optimizer is not None
        flat = list(self._optimizer.state.values())
        keys = sorted({k for s in flat for k, v in s.items() if isinstance(v, torch.Tensor) and v.dim() > 0})
        scalars = {k: v for k, v in (flat[0].items() if flat else ()) if k not in keys}
        return keys, scalars

    def optimizer_state(
        self, *, prefix: str = "", cut: Callable[[torch.Tensor], torch.Tensor] | None = None, numbered: bool = False
    ) -> dict[str, Any]:
        """The optimizer's state in torch's layout, keyed by ``prefix`` + parameter name
        (or numbered, as ``Optimizer.state_dict`` does). A collective. Without ``cut``, each
        parameter's whole state is moved to CPU memory as soon as it is gathered (the whole
        state of a ZeRO run may not fit one GPU); ``load_optimizer_state`` takes it back."""
        from deepspeed.utils import safe_get_full_optimizer_state

        assert self._optimizer is not None
        self._materialize()
        cut = cut or (lambda t: t.cpu())
        keys, scalars = self._state_keys()
        ids = {name: i for i, (name, _) in enumerate(self._optimized())}
        state = {}
        for name, param in self._optimized():
            entry: dict[str, Any] = {k: cut(safe_get_full_optimizer_state(param, k)) for k in keys}
            entry.update({k: _scalar(k, v) for k, v in scalars.items()})
            state[ids[name] if numbered else prefix + name] = entry
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [ids[n] if numbered else prefix + n for n in names]}
            for g, names in zip(self._optimizer.param_groups, self._groups, strict=True)
        ]
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(self, state: dict[str, Any], *, prefix: str = "", numbered: bool = False) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state, safe_set_local_optimizer_state

        assert self._optimizer is not None
        self._materialize()
        keys, scalars = self._state_keys()
        saved = state.get("param_groups", [])
        names = [[prefix + n for n in group] for group in self._groups]
        order = [n for group in names for n in group]  # torch numbers them in this order
        given = [list(g.get("params", [])) for g in saved]
        if numbered:
            given = [[order[i] if isinstance(i, int) and i < len(order) else i for i in g] for g in given]
        if given != names:
            raise ValueError(
                f"the checkpoint's optimizer has parameter groups {[g[:3] for g in given]}, this one "
                f"{[g[:3] for g in names]}: load it into an optimizer built the same way on the same model"
            )
        by_name = state.get("state", {})
        if numbered:
            by_name = {order[i]: v for i, v in by_name.items()}
        extra = sorted({k for s in by_name.values() for k in s} - set(keys) - set(scalars))
        if extra:
            raise ValueError(
                f"the checkpoint's optimizer state has {extra}, this optimizer keeps "
                f"{sorted(keys) + sorted(scalars)}: load it into the same kind of optimizer"
            )
        for name, param in self._optimized():
            entry = by_name.get(prefix + name, {})
            for key in keys:
                if key not in entry:
                    continue
                value = _whole(entry[key])
                if self._zero3(param):
                    safe_set_local_optimizer_state(param, self._local(param, value), key)
                else:
                    safe_set_full_optimizer_state(param, value.to(self._device), key)
        first: dict[str, Any] = next((s for s in by_name.values() if s), {})
        for flat in self._optimizer.state.values():
            for key in scalars:
                if key in first:
                    flat[key] = _like(flat[key], _whole(first[key]))
        for group, old in zip(self._optimizer.param_groups, saved, strict=True):
            group.update({k: v for k, v in old.items() if k != "params"})

    def _materialize(self) -> None:
        """Give a fresh engine its optimizer state (which DeepSpeed creates at the first
        step): one step with zero gradients at learning rate 0, its counters put back and
        the state's step counters reset, so the next step is still the first."""
        assert self._optimizer is not None
        if self._optimizer.state:
            return
        engine = self._engine
        counters = {k: getattr(engine, k) for k in ("global_steps", "global_samples", "micro_steps", "skipped_steps")}
        lrs = [g["lr"] for g in self._optimizer.param_groups]
        for group in self._optimizer.param_groups:
            group["lr"] = torch.zeros_like(group["lr"]) if isinstance(group["lr"], torch.Tensor) else 0.0
        accumulating = engine.gradient_accumulation_steps() > 1 and not self.caller_steps
        params = [p for _, p in self._optimized()]
        try:
            if accumulating:
                engine.set_gradient_accumulation_boundary(True)
            with self._gathered(params):
                engine.backward(sum((p * 0).sum() for p in params))
            engine.step()
        finally:
            if accumulating:
                engine.set_gradient_accumulation_boundary(None)
            for group, lr in zip(self._optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            for key, value in counters.items():
                setattr(engine, key, value)
        for flat in self._optimizer.state.values():
            if "step" in flat:
                flat["step"] = _like(flat["step"], torch.tensor(0.0))

    # -- raw state dicts -----------------------------------------------------------------
    def _register_state_dict_hooks(self, module: nn.Module) -> None:
        params = [p for _, p in self._optimized()]
        if self.options.stage == 3:
            def refuse_state(*_: Any) -> None:
                if not self._raw_state_ok:
                    raise RuntimeError(_ZERO3_OBJECTS)

            def refuse_load(*_: Any) -> None:
                raise RuntimeError(_ZERO3_OBJECTS)

            module.register_state_dict_post_hook(refuse_state)
            module.register_load_state_dict_pre_hook(refuse_load)
            return

        def push_to_master(*_: Any) -> None:
            # load_state_dict wrote the module's parameters; the optimizer steps DeepSpeed's
            # fp32 master copies, which would overwrite them at the next step.
            from deepspeed.utils import safe_set_full_fp32_param

            for param in params:
                safe_set_full_fp32_param(param, param.detach())

        module.register_load_state_dict_post_hook(push_to_master)


def _whole(value: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _scalar(key: str, value: Any) -> Any:
    """A per-group optimizer value in torch's layout: ``step`` as a float32 tensor (what
    torch's Adam keeps; DeepSpeedCPUAdam keeps an int)."""
    if key == "step":
        return torch.tensor(float(value), dtype=torch.float32)
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _like(current: Any, value: Any) -> Any:
    """``value`` in the type ``current`` has (a tensor of its dtype and device, or an int)."""
    if isinstance(current, torch.Tensor):
        return torch.as_tensor(value, dtype=current.dtype, device=current.device).clone()
    number = value.item() if isinstance(value, torch.Tensor) else value
    return type(current)(number)

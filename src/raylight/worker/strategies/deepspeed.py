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

**Checkpoints** are torch's layouts, so a DeepSpeed checkpoint loads under DDP and FSDP and
theirs load here; ``deepspeed_state.EngineState`` reads and writes them (its docstring says
how), and the raw state dicts of the module and the optimizer.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raylight.config.schema import DeepSpeed
from raylight.worker.strategies.base import (
    CheckpointFormat,
    _root,
    backend_for,
    keep_heap_small,
    materialize,
)
from raylight.worker.strategies.base import load_objects as torch_load_objects
from raylight.worker.strategies.base import objects_state as torch_objects_state
from raylight.worker.strategies.deepspeed_config import (
    ELEMENTWISE,
    accumulation_steps,
    engine_config,
    resolve_batch,
)
from raylight.worker.strategies.deepspeed_state import EngineState
from raylight.worker.strategies.fsdp import full_tensors
from raylight.worker.wrapped_optimizer import WrappedOptimizer

INSTALL = "pip install 'raylight[deepspeed]'"


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
        return self._strategy.state().optimizer_state(numbered=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._strategy.state().load_optimizer_state(state_dict, numbered=True)


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
        self._state: EngineState | None = None  # the engine's state in torch's layouts
        self._groups: list[list[str]] = []  # parameter names of each param group
        self._layout: tuple[int, int] | None = None  # (micro_batch, accumulation)
        self._ds: Any = None
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
        self._state = EngineState(
            self._ds, self._module, self._engine, optimizer, self._groups,
            device=self._device, world_size=self._world_size, stage=self.options.stage, caller_steps=adaptive,
        )
        self._state.register_state_dict_hooks()
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
            state = self.state()
            if isinstance(value, nn.Module):
                out[key] = state.model_state(state.shard)
            else:
                out[key] = state.optimizer_state(prefix=f"{model_key}.", cut=state.shard)
        return out

    def load_objects(self, objects: dict[str, Any], state: dict[str, Any], *, full: bool) -> None:
        ours, others, model_key = self._split(objects)
        if others:
            torch_load_objects(others, state, full=full)
        for key, value in ours.items():
            if isinstance(value, nn.Module):
                self.state().load_model_state(state[key], name=key)
            else:
                self.state().load_optimizer_state(state[key], prefix=f"{model_key}.")

    # -- the engine ------------------------------------------------------------------
    def engine(self) -> Any:
        if self._engine is None:
            raise RuntimeError(
                "the DeepSpeed engine is built by ctx.prepare_optimizer(opt): build the optimizer "
                "on model.parameters() and prepare it before the model's first forward"
            )
        return self._engine

    def state(self) -> EngineState:
        """The engine's state in torch's layouts (``deepspeed_state.py``), once it is built."""
        self.engine()  # raises, saying how, before the engine is built
        assert self._state is not None
        return self._state

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

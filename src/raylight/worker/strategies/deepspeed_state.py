"""A built DeepSpeed engine's model and optimizer state in torch's layouts, one parameter
at a time: what ``DeepSpeedStrategy`` checkpoints and loads (``deepspeed.py``).

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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_ZERO3_OBJECTS = (
    "DeepSpeed ZeRO-3 partitions the parameters, so the module's state_dict() would hold "
    "empty placeholders: put the objects in the checkpoint instead, "
    "ctx.report(metrics, checkpoint={'model': model, 'opt': opt}), and load them with "
    "ctx.load_checkpoint({'model': model, 'opt': opt})"
)


class EngineState:
    """The state of one DeepSpeed engine, read and written in torch's layouts (module
    docstring), made once the engine is built. ``shard`` cuts a full tensor to this
    rank's ``Shard(0)`` slice; ``optimizer_state`` without a cut gathers whole tensors to
    CPU memory. Every method that reads or writes state is a collective."""

    def __init__(
        self,
        ds: Any,
        module: nn.Module,
        engine: Any,
        optimizer: torch.optim.Optimizer,
        groups: list[list[str]],
        *,
        device: torch.device,
        world_size: int,
        stage: int,
        caller_steps: bool,
    ) -> None:
        self._ds = ds  # the deepspeed module
        self._module = module
        self._engine = engine
        self._optimizer = optimizer
        self._groups = groups  # parameter names of each param group
        self._device = device
        self._world_size = world_size
        self._stage = stage
        self.caller_steps = caller_steps  # adaptive runs: raylight's AdaptiveOptimizer ends each step
        self._mesh: Any = None
        self._raw_state_ok = False

    def _zero3(self, param: torch.Tensor) -> bool:
        return hasattr(param, "ds_id")  # the mark DeepSpeed's safe_* helpers test too

    def _entries(self) -> dict[str, torch.Tensor]:
        """The module's state-dict entries (parameters as themselves), placeholders and all."""
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

    def shard(self, full: torch.Tensor) -> torch.Tensor:
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

    def model_state(self, cut: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, value in self._entries().items():
            if isinstance(value, nn.Parameter):
                out[name] = cut(self._full_param(value))
            else:  # buffers: whole on every rank
                out[name] = value.detach().clone()
        return out

    def load_model_state(self, state: dict[str, Any], *, name: str) -> None:
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
        params = dict(self._module.named_parameters())
        for group in self._groups:
            for name in group:
                yield name, params[name]

    def _state_keys(self) -> tuple[list[str], dict[str, Any]]:
        """The optimizer's per-element state keys (``exp_avg``, ...) and its per-group
        values (``step``), read from its flat partitions."""
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

    def register_state_dict_hooks(self) -> None:
        """Raw state dicts (module docstring): ZeRO-3's module refuses them; under ZeRO-1/2
        a loaded one is pushed into DeepSpeed's fp32 master weights."""
        params = [p for _, p in self._optimized()]
        if self._stage == 3:
            def refuse_state(*_: Any) -> None:
                if not self._raw_state_ok:
                    raise RuntimeError(_ZERO3_OBJECTS)

            def refuse_load(*_: Any) -> None:
                raise RuntimeError(_ZERO3_OBJECTS)

            self._module.register_state_dict_post_hook(refuse_state)
            self._module.register_load_state_dict_pre_hook(refuse_load)
            return

        def push_to_master(*_: Any) -> None:
            # load_state_dict wrote the module's parameters; the optimizer steps DeepSpeed's
            # fp32 master copies, which would overwrite them at the next step.
            from deepspeed.utils import safe_set_full_fp32_param

            for param in params:
                safe_set_full_fp32_param(param, param.detach())

        self._module.register_load_state_dict_post_hook(push_to_master)


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

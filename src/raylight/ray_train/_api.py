"""Ray Train's worker API, answered by raylight's ``TrainContext`` while a Ray Train
``train_func`` runs in a raylight worker.

The names are swapped on Ray's modules (``ray.train.report``, ``ray.train.torch.
prepare_model``, ...) and in the function's own module globals where it imported them by
name (``from ray.train import report``), and put back when the function returns, so a
pooled worker process is left as it was. Ray Train's meaning is kept where raylight's
differs: a DataLoader's ``batch_size`` is per worker there, so ``prepare_data_loader``
gives raylight ``batch_size * world_size`` (raylight's is the global batch).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

FILES_KEY = "ray_train_files"  # a Ray Train checkpoint's files, as raylight's checkpoint


class RayTrainContext:
    """``ray.train.get_context()``'s answers, from raylight's ``TrainContext``."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def get_world_size(self) -> int:
        return int(self._ctx.world_size)

    def get_world_rank(self) -> int:
        return int(self._ctx.rank)

    def get_local_rank(self) -> int:
        return int(self._ctx.local_rank)

    def get_node_rank(self) -> int:
        return int(self._ctx.node_rank)

    def get_local_world_size(self) -> int:
        return int(getattr(self._ctx, "local_world_size", 1))

    def get_metadata(self) -> dict[str, Any]:
        return {}


class _EpochSampler:
    """What ``loader.sampler.set_epoch(epoch)`` reaches: the loader's epoch."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class PreparedLoader:
    """raylight's sharded loader with the DataLoader attributes Ray Train code reads."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self.sampler = _EpochSampler(loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._loader)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _prepare_data_loader(
    ctx: Any, data_loader: DataLoader, *args: Any, **kwargs: Any
) -> PreparedLoader:
    per_worker = data_loader.batch_size
    if per_worker is None:
        raise TypeError(
            "prepare_data_loader: a DataLoader with a batch_sampler (batch_size=None) cannot be "
            "sharded by raylight; give it batch_size= instead"
        )
    # Ray Train: batch_size is each worker's. raylight: the global batch.
    return PreparedLoader(ctx.prepare_loader(data_loader, batch_size=per_worker * ctx.world_size))


def _report(ctx: Any, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
    state = None
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            files = {}
            for root, _, names in os.walk(folder):
                for name in names:
                    path = os.path.join(root, name)
                    with open(path, "rb") as f:
                        files[os.path.relpath(path, folder)] = torch.frombuffer(
                            bytearray(f.read()), dtype=torch.uint8
                        )
        state = {FILES_KEY: files}
    ctx.report(dict(metrics), checkpoint=state)


def _get_checkpoint(ctx: Any) -> Any:
    found = ctx.get_checkpoint()
    if found is None:
        return None
    files = found.load().get(FILES_KEY)
    if files is None:
        return None
    from ray.train import Checkpoint

    folder = tempfile.mkdtemp(prefix="raylight-ray-train-")
    for rel, data in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.numpy().tobytes())
    return Checkpoint.from_directory(folder)


def _replacements(ctx: Any) -> dict[tuple[Any, str], Any]:
    import ray.train
    import ray.train.torch

    context = RayTrainContext(ctx)
    return {
        (ray.train, "report"): lambda metrics, checkpoint=None, **kw: _report(
            ctx, metrics, checkpoint, **kw
        ),
        (ray.train, "get_context"): lambda: context,
        (ray.train, "get_checkpoint"): lambda: _get_checkpoint(ctx),
        (ray.train.torch, "prepare_model"): lambda model, *a, **kw: ctx.prepare_model(model),
        (ray.train.torch, "prepare_data_loader"): lambda loader, *a, **kw: _prepare_data_loader(
            ctx, loader
        ),
        (ray.train.torch, "get_device"): lambda: ctx.device,
    }


@contextlib.contextmanager
def ray_train_api(ctx: Any, func: Any) -> Iterator[None]:
    """Ray Train's names answer from ``ctx`` inside the block, on Ray's modules and in
    ``func``'s globals where it holds Ray's own functions; put back after."""
    replaced = _replacements(ctx)
    originals = {key: getattr(*key) for key in replaced}
    own = getattr(func, "__globals__", {})
    by_name = {
        name: replaced[key]
        for key, original in originals.items()
        for name, v in own.items()
        if v is original
    }
    saved = {name: own[name] for name in by_name}
    try:
        for (module, name), new in replaced.items():
            setattr(module, name, new)
        own.update(by_name)
        yield
    finally:
        own.update(saved)
        for (module, name), original in originals.items():
            setattr(module, name, original)


def run_ray_train_func(ctx: Any, config: dict[str, Any]) -> None:
    """raylight's loop: the Ray Train function, called as Ray Train calls it."""
    func, loop_config = config["func"], config["config"]
    takes_config = bool(inspect.signature(func).parameters)
    with ray_train_api(ctx, func):
        func(loop_config) if takes_config else func()

"""Which backend a declarative run trains on (local, ray, or a launcher's processes) and
with how many workers: connecting to Ray (while the driver preprocesses) and checking the
resources the backend asks for, before anything is written."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from raylight.base.exceptions import ConfigError
from raylight.declarative.config.model import ModelConfig

log = logging.getLogger("raylight")
T = TypeVar("T")

LAUNCHED = ("launcher", "horovod", "deepspeed")  # backend types that run under an external launcher


@dataclass
class Backend:
    kind: str  # "local", "ray" or "launcher"
    num_workers: int | tuple[int, int]
    use_gpu: bool
    resources: dict[str, float] | None
    rank: int = 0  # this process's rank under a launcher; 0 elsewhere


def backend_kind(config: ModelConfig, override: str | None) -> str:
    """"local", "ray" or "launcher": which backend ``resolve_backend`` gives, without
    connecting to Ray."""
    from raylight.worker import process_group

    kind = override or config.backend.type
    if kind is not None and kind not in ("local", "ray", *LAUNCHED):
        raise ConfigError(f"backend must be local, ray or launcher, got {kind!r}")
    if process_group.detect() is not None:
        return "launcher"
    if kind in LAUNCHED:
        where = "--backend" if override else "backend.type"
        raise ConfigError(
            f"{where} {kind} trains in the processes a launcher starts, but no launcher started this one; "
            "run it as `torchrun --nproc-per-node N -m raylight.cli train ...`, `horovodrun -np N raylight train ...` "
            "or `deepspeed --no_python --num_gpus N raylight train ...`, or use the ray backend"
        )
    if kind is None:
        import ray

        kind = "ray" if (os.environ.get("RAY_ADDRESS") or ray.is_initialized()) else "local"
    return kind


def resolve_backend(config: ModelConfig, override: str | None, *, connecting: Callable[[], None] | None = None) -> Backend:
    """Which backend runs, with how many workers; connects to Ray for the ray backend and
    checks the resources it asks for exist. A process torchrun, horovodrun, mpirun or the
    deepspeed launcher started runs in the launcher's group, whatever the backend says.
    ``connecting`` is called once the checks that need no Ray passed, before connecting."""
    from raylight.worker import process_group

    kind, t = backend_kind(config, override), config.backend.trainer
    if kind == "launcher":
        launch = process_group.detect()
        assert launch is not None
        wanted = override or config.backend.type
        if launch.rank == 0 and wanted not in (None, *LAUNCHED):
            log.info("started by %s: its %d processes train (backend %s is not used)", launch.launcher, launch.world_size, wanted)
        return Backend("launcher", launch.world_size, t.use_gpu, None, rank=launch.rank)
    if kind == "local":
        return Backend("local", 0, t.use_gpu, None)
    import ray

    from raylight.config.schema import default_worker_resources
    from raylight.driver import runtime

    per = default_worker_resources(t.resources_per_worker, use_gpu=t.use_gpu)
    if runtime.would_start_embedded(None):  # what can be checked before starting Ray
        check_resources(t, per, runtime.local_capacity(), "this machine", sized_by_ray=True)
    if connecting is not None:
        connecting()
    runtime.connect(None)
    total = ray.cluster_resources()
    if t.min_workers is not None or t.max_workers is not None:
        lo = t.min_workers or 1
        hi = t.max_workers or max(lo, int(total.get("CPU", 1) // per["CPU"]))
        workers: int | tuple[int, int] = (lo, hi)
        need = lo
    else:
        fits = int(min(total.get(k, 0.0) // v for k, v in per.items() if v > 0))
        workers = t.num_workers or max(1, fits)
        need = workers
    check_resources(t, per, total, "the cluster", need=need)
    return Backend("ray", workers, t.use_gpu, per)


def connect_while(
    preprocess: Callable[[], T], config: ModelConfig, backend: str | None,
    connected: Callable[[Backend], None] | None = None,
) -> tuple[Backend, float, T]:
    """``resolve_backend`` (Ray's start: seconds on a laptop) in this thread while
    ``preprocess``, which needs no Ray, runs in another; ``connected`` is called with the
    backend as soon as it is resolved, still beside preprocessing. Returns the backend, the
    seconds connecting took, and the preprocessed data. A backend that connects to nothing
    preprocesses after; an error connecting is raised at once (the thread is a daemon:
    it ends with the process, and a cache entry it was writing stays uncommitted)."""
    out: dict[str, Any] = {}

    def side() -> None:
        try:
            out["prepared"] = preprocess()
        except BaseException as exc:  # raised in the caller's thread below
            out["error"] = exc

    began = time.monotonic()
    thread = threading.Thread(target=side, name="raylight-preprocess", daemon=True)
    resolved = resolve_backend(config, backend, connecting=thread.start)
    connect_s = time.monotonic() - began
    if connected is not None:
        connected(resolved)
    if thread.ident is None:  # nothing to connect to
        side()
    else:
        thread.join()
    if "error" in out:
        raise out["error"]
    return resolved, connect_s, out["prepared"]


def check_resources(
    t: Any, per: dict[str, float], total: dict[str, float], where: str, *, need: int | None = None, sized_by_ray: bool = False
) -> None:
    """The workers backend.trainer asks for fit ``total``. ``sized_by_ray``: ``total`` is
    what this machine is known to have before Ray starts; resources it does not size
    (memory, GPUs where a driver exists) are left to Ray."""
    if need is None:
        need = t.min_workers or t.num_workers or 1
    for key, amount in per.items():
        if sized_by_ray and key not in total and key in ("memory", "object_store_memory", "GPU"):
            continue
        have = total.get(key, 0.0)
        if amount * need > have:
            fix = "lower backend.trainer.num_workers" + (" (or min_workers)" if t.min_workers else "")
            if key == "GPU":
                fix += " or set backend.trainer.use_gpu: false"
            elif key not in ("CPU", "GPU"):
                fix = f"remove {key!r} from backend.trainer.resources_per_worker, or run on a cluster that has it"
            raise ConfigError(
                f"backend.trainer asks for {need} workers x {key}: {amount:g} = {amount * need:g} {key}, "
                f"but {where} has {have:g}; {fix}"
            )


def prestart(resolved: Backend, config: ModelConfig) -> None:
    """The ray backend's workers start (and import torch and the training loop's module)
    while the driver still preprocesses, rather than after it."""
    if resolved.kind != "ray":
        return
    from raylight.driver.trainer import prestart_workers

    prestart_workers(
        num_workers=resolved.num_workers, use_gpu=resolved.use_gpu, resources_per_worker=resolved.resources,
        strategy=config.backend.trainer.strategy, modules=("raylight.declarative.train",),
    )


@contextlib.contextmanager
def launched_group() -> Iterator[Any]:
    """Under a launcher with more than one process: its group, formed here and destroyed
    after (the LaunchEnv is yielded); None elsewhere."""
    from raylight.worker import process_group

    launch = process_group.detect()
    if launch is None or launch.world_size == 1:
        yield None
        return
    process_group.init_process_group(launch, "gloo")
    try:
        yield launch
    finally:
        process_group.destroy_process_group()

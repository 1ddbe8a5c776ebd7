"""Training loops for the worker-pool tests: each reports its worker's process id."""

from __future__ import annotations

import importlib
import os
import sys
import threading

import torch

LEFT_BEHIND = "RAYLIGHT_TEST_LEFT_BEHIND"


def _pids() -> str:
    """Every rank's process id, in rank order (a string: report values are scalars)."""
    import torch.distributed as dist

    pids: list = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return ",".join(map(str, pids))


def unseeded_loop(ctx, config):
    """Draws from torch's default generator without seeding it (new processes draw
    differently every run; so must a reused one), and changes process-wide state the next run on this
    process must not see: an environment variable, torch's default dtype and its
    deterministic mode."""
    seen = os.environ.get(LEFT_BEHIND, "")
    dtype = str(torch.get_default_dtype())
    deterministic = f"{torch.are_deterministic_algorithms_enabled()},{torch.is_deterministic_algorithms_warn_only_enabled()}"
    draw = float(torch.randn(()).item())
    os.environ[LEFT_BEHIND] = "1"
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True, warn_only=True)
    draws = [None] * ctx.world_size
    torch.distributed.all_gather_object(draws, draw)
    ctx.report({"pids": _pids(), "draws": ",".join(map(str, draws)), "seen": seen, "dtype": dtype, "deterministic": deterministic})


_STOP = threading.Event()


def thread_leaving_loop(ctx, config):
    """Leaves a thread running: its process must not be reused."""
    threading.Thread(target=_STOP.wait, name="user-thread", daemon=True).start()
    ctx.report({"pids": _pids()})


def module_loop(ctx, config):
    """Imports the user's own module from ``config['dir']``."""
    if config["dir"] not in sys.path:
        sys.path.insert(0, config["dir"])
    module = importlib.import_module("pool_user_module")
    ctx.report({"pids": _pids(), "value": module.VALUE})


def pid_loop(ctx, config):
    ctx.report({"pids": _pids()})


def adam_pid_loop(ctx, config):
    """Two epochs of Adam on tests.support.deepspeed_loops' model and data under the run's
    strategy (the model built on the meta device with ``config["meta"]``); checkpoints the
    prepared model and optimizer."""
    from tests.support import deepspeed_loops as ds
    from tests.support.loops import train_epoch

    with torch.device("meta" if config.get("meta") else "cpu"):  # meta: each rank builds only its shards
        built = ds.initial_model()
    model = ctx.prepare_model(built)
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=ds.LR))
    loader = ctx.prepare_loader(ds.data(), batch_size=ds.BATCH, shuffle=True)
    for epoch in range(2):
        loader.set_epoch(epoch)
        train_epoch(model, opt, loader)
    ctx.report({"pids": _pids()}, checkpoint={"model": model, "opt": opt})

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
    process must not see: an environment variable and torch's default dtype."""
    seen = os.environ.get(LEFT_BEHIND, "")
    dtype = str(torch.get_default_dtype())
    draw = float(torch.randn(()).item())
    os.environ[LEFT_BEHIND] = "1"
    torch.set_default_dtype(torch.float64)
    draws = [None] * ctx.world_size
    torch.distributed.all_gather_object(draws, draw)
    ctx.report({"pids": _pids(), "draws": ",".join(map(str, draws)), "seen": seen, "dtype": dtype})


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


def sgd_pid_loop(ctx, config):
    """tests.ray.loops.sgd_loop, also reporting its processes."""
    from tests.ray import loops

    loops.sgd_loop(ctx, {**config, "also_report": {"pids": _pids()}})

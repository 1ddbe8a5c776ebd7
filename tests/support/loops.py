"""Training loops the Ray tests run on workers (importable as tests.support.loops)."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
from torch import nn

from tests.helpers import wait_until


def regression_data(n: int = 256, d: int = 8) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(d, 1, generator=gen, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=gen, dtype=torch.float64)
    return torch.utils.data.TensorDataset(x, y)


def initial_model(d: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(d, 1).double()


def train_epoch(model, opt, loader) -> float:
    """One epoch of the README's loop; the sum of the batches' losses."""
    total = 0.0
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        total += loss.item()
    return total


def _regression_epochs(model, opt, loader, epochs: int) -> None:
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()


def sgd_loop(ctx, config):
    """Plain SGD on a linear regression; reports the final parameters."""
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = ctx.prepare_loader(regression_data(), batch_size=config["batch_size"], shuffle=True, seed=7)
    _regression_epochs(model, opt, loader, config["epochs"])
    tunables = os.environ.get("GLIBC_TUNABLES")  # what the worker started with, if anything
    metrics = {"world_size": ctx.world_size, **({"tunables": tunables} if tunables else {})}
    if config.get("report_hooks"):  # DDP's communication hooks (torch keeps them in _comm_hooks)
        metrics["hooks"] = ",".join(f"{h.__module__}.{h.__name__}" for h, _ in getattr(model, "_comm_hooks", []))
    if config.get("report_hosts"):  # each rank's hostname, in rank order (tests/hosts/)
        metrics["hosts"] = _hostnames(ctx.world_size)
    ctx.report(metrics, checkpoint={"model": ctx.unwrap_model(model).state_dict()})


def _hostnames(world_size: int) -> list[str]:
    import socket

    import torch.distributed as dist

    names: list[str | None] = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(names, socket.gethostname())
    else:
        names = [socket.gethostname()]
    return [str(n) for n in names]


def reference_sgd(config) -> dict[str, torch.Tensor]:
    """The same optimisation in one plain process, no raylight."""
    model = initial_model()
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x_all, y_all = regression_data().tensors
    n, bs = len(x_all), config["batch_size"]
    for epoch in range(config["epochs"]):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(7 + epoch))
        for start in range(0, n, bs):
            idx = order[start : start + bs]
            opt.zero_grad()
            nn.functional.mse_loss(model(x_all[idx]), y_all[idx]).backward()
            opt.step()
    return model.state_dict()


def _explode(step: int) -> None:
    raise ValueError(f"boom at step {step}")


def failing_loop(ctx, config):
    for step in range(5):
        ctx.all_reduce(1.0)
        if ctx.rank == 1 and step == 3:
            _explode(step)


def name_error_loop(ctx, config):
    """Every attempt appends its rank to ``config["attempts"]``, then the loop refers to a
    name that does not exist, before any report: the same error on every attempt."""
    with open(config["attempts"], "a") as f:
        f.write(f"{ctx.rank}\n")
    return modle(ctx.rank)  # noqa: F821  (the mistake under test)


def hanging_loop(ctx, config):
    ctx.report({"started": 1})
    if ctx.rank == 1:
        threading.Event().wait()  # never set: a hung worker


def rank0_barrier_loop(ctx, config):
    """A collective only rank 0 calls: rank 1 finishes, rank 0 waits in it."""
    ctx.report({"started": 1})
    if ctx.rank == 0:
        ctx.barrier()


def epoch_loop(ctx, config):
    """Checkpoints every epoch; optionally SIGKILLs rank 1 once, after checkpoint
    ``kill_after`` is committed; optionally blocks forever after ``block_after``."""
    ckpt = ctx.get_checkpoint()
    start = ckpt.load()["epoch"] + 1 if ckpt is not None else 0
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if ckpt is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    loader = ctx.prepare_loader(regression_data(64), batch_size=16, shuffle=True)
    if ctx.rank == 0 and config.get("log"):
        with open(config["log"], "a") as f:
            f.write(f"start {start}\n")
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        total = train_epoch(model, opt, loader)
        ctx.report(
            {"epoch": epoch, "start": start, "loss": ctx.all_reduce(total)},
            checkpoint={"epoch": epoch, "model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()},
        )
        kill = config.get("kill_after")
        if kill is not None and epoch == kill and ctx.rank == 1 and not os.path.exists(config["marker"]):
            committed = os.path.join(config["run_dir"], "checkpoints", f"checkpoint_{kill:06d}", "meta.json")
            wait_until(lambda path=committed: os.path.exists(path), 60, "the checkpoint to be committed")
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if config.get("block_after") is not None and epoch == config["block_after"]:
            threading.Event().wait(600)


def id_regression_data(n: int = 240, d: int = 8, noise: float = 0.1) -> torch.utils.data.TensorDataset:
    x, y = regression_data(n, d).tensors
    if noise != 0.1:
        gen = torch.Generator().manual_seed(99)
        y = y + noise * torch.randn(y.shape, generator=gen, dtype=torch.float64)
    return torch.utils.data.TensorDataset(torch.arange(n), x, y)


def elastic_loop(ctx, config):
    """Trains until ``epochs`` or until a stop file appears (agreed by all ranks at an
    epoch end). Accumulates, per epoch, the count, sum and sum of squares of the sample
    ids seen, so a test can check each epoch saw every sample exactly once."""
    dtype = torch.float32 if config.get("float32") else torch.float64  # DeepSpeed: fp32
    model = ctx.prepare_model(initial_model().to(dtype))
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.02)))
    objects = config.get("objects", False)  # checkpoint the model and optimizer as objects
    if objects:
        ctx.load_checkpoint({"model": model, "opt": opt})
    elif (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    def state():
        if objects:
            return {"model": model, "opt": opt}
        return {"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()}

    data = id_regression_data(config.get("n", 240), noise=config.get("noise", 0.1))
    loader = ctx.prepare_loader(data, batch_size=config["batch_size"], shuffle=True, adaptive=config.get("adaptive", True))
    seen = ctx.accumulator()
    # kills: [[rank, step], ...]: in the k-th attempt, rank SIGKILLs itself at its step-th
    # step since the (re)start, once (a marker file per kill records that it happened).
    kills = config.get("kills", [])
    attempt = sum(os.path.exists(f"{config.get('marker')}{i}") for i in range(len(kills)))
    # notice: [rank, step, how]: that rank gives its node notice at that step, once: by
    # SIGTERM to itself ("sigterm") or by writing a notice file ("file:PATH").
    notice = config.get("notice") or [None, None, None]
    # positions: rank 0 appends "epoch cursor world_size" after each step (a step run
    # twice shows as a repeated position); notice_file: where a test says it gave notice.
    positions = open(config["positions"], "a") if config.get("positions") and ctx.rank == 0 else None  # noqa: SIM115
    step = 0
    for epoch in ctx.epochs(config["epochs"]):
        this_epoch = ctx.accumulator()  # AdaptDL's pattern: a new one each epoch (and `seen` for the run)
        for ids, x, y in loader:
            if attempt < len(kills) and kills[attempt] == [ctx.rank, step]:
                open(f"{config['marker']}{attempt}", "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if notice[:2] == [ctx.rank, step] and not os.path.exists(config["notice_marker"]):
                open(config["notice_marker"], "w").close()
                if notice[2] == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                else:
                    with open(notice[2].removeprefix("file:"), "w") as f:
                        f.write('{"reason": "test notice"}')
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(dtype)), y.to(dtype))
            loss.backward()
            opt.step()
            if config.get("step_s"):  # a long step's compute, modelled (steps of a big model)
                time.sleep(config["step_s"])
            seen[f"sse{epoch}"] += loss.item() * len(ids)  # restart-safe and K-invariant
            seen[f"count{epoch}"] += len(ids)
            seen[f"sum{epoch}"] += float(ids.sum())
            seen[f"sq{epoch}"] += float((ids.double() ** 2).sum())
            this_epoch["count"] += len(ids)
            if positions is not None:
                positions.write(f"{epoch} {loader.cursor} {ctx.world_size}\n")
                positions.flush()
            step += 1
            if step % config.get("checkpoint_every", 5) == 0:
                ctx.report({"kind": "step"}, checkpoint=state())
        with seen.synchronized():
            totals = {k: seen[k] for k in (f"count{epoch}", f"sum{epoch}", f"sq{epoch}", f"sse{epoch}")}
        with this_epoch.synchronized():
            totals["epoch_count"] = this_epoch["count"]
        ctx.report(
            {"kind": "epoch", "epoch": epoch, "workers": ctx.world_size, "batch": ctx.batch_size,
             "resumed_sharded": bool(ctx.get_checkpoint() and ctx.get_checkpoint().sharded),
             **{k.rstrip("0123456789"): v for k, v in totals.items()}},
            # reference runs (uninterrupted, compared epoch by epoch) need no checkpoints
            checkpoint=state() if config.get("epoch_checkpoints", True) else None,
        )
        stop = 1.0 if config.get("stop_file") and os.path.exists(config["stop_file"]) else 0.0
        if ctx.all_reduce(stop, op="max") > 0:
            break


def gc_loop(ctx, config):
    """Reports how many objects the garbage collector holds frozen at the loop's start,
    and after the loop's setup made ``setup_objects`` more and its first batch came."""
    import gc

    at_start = gc.get_freeze_count()
    kept = [[i] for i in range(config["setup_objects"])]  # lists: always tracked
    loader = ctx.prepare_loader(regression_data(), batch_size=32)
    next(iter(loader))
    ctx.report({"at_start": at_start, "after_first_batch": gc.get_freeze_count(), "kept": len(kept)})


def listening_loop(ctx, config):
    """Exchanges objects over gloo, writes this worker's pid, then holds the group up
    until the test has listed the sockets (the file ``release`` appears)."""
    import torch.distributed as dist

    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, {"rank": ctx.rank})
    with open(os.path.join(config["dir"], f"pid{ctx.rank}"), "w") as f:
        f.write(str(os.getpid()))
    wait_until(lambda: os.path.exists(config["release"]), 120, "the test to list the sockets")
    ctx.barrier()
    ctx.report({"gathered": len(gathered)})


def sharding_loop(ctx, config):
    """Reports whether prepare_model sharded the parameters (FSDP) and the world size."""
    from torch.distributed.tensor import DTensor

    model = ctx.prepare_model(initial_model())
    ctx.report({"sharded": isinstance(next(iter(model.parameters())), DTensor), "world_size": ctx.world_size})


def timed_loop(ctx, config):
    """Runs ``seconds`` (heartbeating), reporting its start and end on the wall clock."""
    import time

    start = time.time()
    ctx.report({"start": start})
    while time.time() - start < config["seconds"]:
        time.sleep(0.05)
        ctx.heartbeat()
    ctx.report({"start": start, "end": time.time()})


def clipped_loop(ctx, config):
    """One epoch of SGD (lr 0.1) whose every step's gradient is clipped to ``config["clip"]``
    through ``prepare_optimizer``; reports how far the parameters moved and the smallest
    norm a step found before clipping."""
    model = ctx.prepare_model(initial_model())
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=config["clip"])
    loader = ctx.prepare_loader(regression_data(), batch_size=32, shuffle=True, seed=7, adaptive=True)
    norms = []
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        norms.append(ctx.grad_norm)
    start = dict(initial_model().named_parameters())
    moved = max(float((p - start[n]).abs().max()) for n, p in ctx.unwrap_model(model).named_parameters())
    ctx.report({"moved": moved, "min_norm": min(n for n in norms if n is not None), "optimizer": type(opt).__name__})


def prepared_sgd_loop(ctx, config):
    """sgd_loop with momentum and the optimizer prepared by the strategy (the horovod
    strategy wraps it in hvd.DistributedOptimizer); with ``config["hvd"]`` the loop also
    imports that Horovod module ("horovod.torch" or "raylight.horovod") and reports what
    it is and an ``hvd.allreduce`` of the rank."""
    import importlib

    model = ctx.prepare_model(initial_model())
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    loader = ctx.prepare_loader(regression_data(), batch_size=config["batch_size"], shuffle=True, seed=7)
    _regression_epochs(model, opt, loader, config["epochs"])
    metrics = {"world_size": ctx.world_size}
    if config.get("hvd"):
        hvd = importlib.import_module(config["hvd"])
        metrics.update(
            hvd_real=int(hasattr(hvd, "mpi_lib_v2")),  # real Horovod's compiled library
            hvd_size=hvd.size(),
            hvd_rank_mean=float(hvd.allreduce(torch.tensor(float(hvd.rank())))),
        )
    ctx.report(metrics, checkpoint={"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()})


class CountsPickles:
    """A config value that counts, in the process that holds it, how often it is pickled."""

    pickled = 0

    def __reduce__(self):
        type(self).pickled += 1
        return (CountsPickles, ())


def unpollable_loop(ctx, config):
    """Rank 1 hands its worker a report whose metrics cannot be pickled, past ctx.report's
    check (which refuses them): the worker's next poll answer cannot be serialised."""
    import threading

    from raylight.worker.protocol import Report

    if ctx.rank == 1:
        ctx._sink.report(Report(metrics={"lock": threading.Lock()}))
    ctx.barrier()  # both finish; rank 1's answer to the next poll carries the report

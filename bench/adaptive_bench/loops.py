"""What runs inside the workers: the time-to-target loop every system shares (with rank 0's
Timeline and the scale-invariant Budget), raylight's and Ray Train's wrappers of it, the
throughput loop and the elastic loop of the resize runs. Rank 0 writes its timings to the
job's result_path, as wall-clock timestamps the parent measures against the launch."""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from adaptive_bench import SKIP_STEPS
from adaptive_bench.tasks import (
    accuracy,
    max_epochs,
    sgd,
    synthetic,
    task_model,
    tensors,
    throughput_model,
)


class Timeline:
    """Rank 0's wall-clock record: first step, and each epoch's end with its accuracy."""

    def __init__(self) -> None:
        self.first_batch: float | None = None
        self.first_step_end: float | None = None
        self.steps = 0
        self.samples = 0
        self.epochs: list[dict[str, Any]] = []

    def before_step(self) -> None:
        if self.first_batch is None:
            self.first_batch = time.time()

    def after_step(self, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        if self.first_step_end is None:
            self.first_step_end = time.time()

    def epoch_end(self, epoch: int, acc: float, batch: int, progress: float) -> None:
        self.epochs.append(
            {
                "epoch": epoch,
                "time": time.time(),
                "accuracy": acc,
                "micro_steps": self.steps,
                "samples": self.samples,
                "global_batch": batch,
                "progress": progress,
            }
        )

    def write(self, path: str) -> None:
        data = {
            "first_batch": self.first_batch,
            "first_step_end": self.first_step_end,
            "epochs": self.epochs,
            "torch_threads": torch.get_num_threads(),
            "pid": os.getpid(),
        }
        Path(path).write_text(json.dumps(data))


class Budget:
    """The training budget in scale-invariant steps (AdaScale, Johnson et al. 2020): the
    job's epochs of optimizer steps at the initial batch. ``progress()`` counts optimizer
    steps for a fixed batch and the sum of AdaScale gains for the adaptive run, so every
    system trains the same amount and the LR drops 10x at the same point of it
    (``lr_decay_at``; 0: never)."""

    def __init__(
        self,
        job: dict[str, Any],
        sgd: torch.optim.SGD,
        scale_invariant: Callable[[], float] | None = None,
    ):
        steps_per_epoch = math.ceil(len(tensors(job, "train")) / job["batch_size"])
        self.steps = job["epochs"] * steps_per_epoch
        decay = job.get("lr_decay_at", 0.0)
        self.decay_at = decay * self.steps if decay > 0 else math.inf
        self.sgd, self.lr = sgd, job["lr"]
        self.scale_invariant = scale_invariant  # the adaptive optimizer's progress
        self.taken = 0  # optimizer steps (loop iterations) taken

    def progress(self) -> float:
        return self.scale_invariant() if self.scale_invariant is not None else self.taken

    @property
    def spent(self) -> bool:
        return self.progress() >= self.steps

    def set_lr(self) -> None:
        """The base LR for the next step (the adaptive run's LR rule scales it)."""
        lr = self.lr * (0.1 if self.progress() >= self.decay_at else 1.0)
        for group in self.sgd.param_groups:
            group["lr"] = lr


def train_to_target(
    model: nn.Module,
    opt: Any,
    budget: Budget,
    loader: Iterable,
    epochs: Iterable[int],
    report: Callable[[dict[str, Any]], None],
    global_batch: Callable[[], int],
    job: dict[str, Any],
    rank: int,
    world_size: int,
) -> None:
    """The loop all three systems run, until the budget is spent (an epoch cut short
    then is evaluated too); rank 0 writes its Timeline to the result file."""
    test = tensors(job, "test")
    loss_fn = nn.CrossEntropyLoss()
    clock = Timeline()
    for epoch in epochs:
        model.train()
        for x, y in loader:
            clock.before_step()
            budget.set_lr()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            budget.taken += 1
            clock.after_step(len(y) * world_size)
            if budget.spent:
                break
        acc = accuracy(model, test)
        clock.epoch_end(epoch, acc, global_batch(), budget.progress())
        report({"epoch": epoch, "test_accuracy": acc})
        if budget.spent:
            break
    if rank == 0:
        clock.write(job["result_path"])


def raylight_ttt_loop(ctx: Any, job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    model = ctx.prepare_model(task_model(job))
    base = sgd(model, job)
    opt = ctx.prepare_optimizer(base)
    adaptive = job["system"] == "raylight_adaptive"
    loader = ctx.prepare_loader(
        tensors(job, "train"),
        batch_size=job["batch_size"],
        shuffle=True,
        seed=job["seed"],
        adaptive=adaptive,
    )
    train_to_target(
        model,
        opt,
        Budget(job, base, (lambda: opt.progress) if adaptive else None),
        loader,
        ctx.epochs(max_epochs(job) if adaptive else job["epochs"]),
        ctx.report,
        lambda: ctx.batch_size or job["batch_size"],
        job,
        ctx.rank,
        ctx.world_size,
    )


def ray_train_ttt_loop(job: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    world_size = ctx.get_world_size()
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(tensors(job, "train"), batch_size=job["batch_size"] // world_size, shuffle=True)
    )
    model = ray.train.torch.prepare_model(task_model(job))
    opt = sgd(model, job)

    def epochs() -> Iterable[int]:
        for epoch in range(job["epochs"]):
            loader.sampler.set_epoch(epoch)
            yield epoch

    train_to_target(
        model,
        opt,
        Budget(job, opt),
        loader,
        epochs(),
        ray.train.report,
        lambda: job["batch_size"],
        job,
        ctx.get_world_rank(),
        world_size,
    )


def throughput_loop(ctx: Any, job: dict[str, Any]) -> None:
    """Steady samples/s on a bigger MLP; the same loop with and without adaptive=."""
    torch.set_num_threads(1)
    model = ctx.prepare_model(throughput_model(job))
    opt = ctx.prepare_optimizer(sgd(model, job))
    loader = ctx.prepare_loader(
        synthetic(job["samples"], job["seed"]),
        batch_size=job["batch_size"],
        shuffle=True,
        seed=job["seed"],
        adaptive=job["system"] == "raylight_pinned",
    )
    loss_fn = nn.CrossEntropyLoss()
    stamps: list[float] = []
    batches: list[int] = []
    measuring: list[bool] = []  # the step measured gradient noise (StepSync's flag)
    first_step_end = None
    for _ in ctx.epochs(1):
        for x, y in loader:
            measuring.append(bool(ctx.sync is not None and ctx.sync.measuring))
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            stamps.append(time.perf_counter())
            batches.append(len(y) * ctx.world_size)
            if len(stamps) == 1:
                first_step_end = time.time()
    if ctx.rank == 0:
        steady = stamps[SKIP_STEPS:]
        rate = (
            sum(batches[SKIP_STEPS + 1 :]) / (steady[-1] - steady[0]) if len(steady) > 1 else None
        )
        gaps = sorted(b - a for a, b in itertools.pairwise(steady))
        # Step i's time is stamps[i] - stamps[i - 1]: measuring steps against the others.
        timed = [(measuring[i], stamps[i] - stamps[i - 1]) for i in range(SKIP_STEPS + 1, len(stamps))]
        meas = [t for m, t in timed if m]
        other = [t for m, t in timed if not m]
        meas_s = statistics.fmean(meas) if meas else None
        other_s = statistics.fmean(other) if other else None
        Path(job["result_path"]).write_text(
            json.dumps(
                {
                    "steps": len(stamps),
                    "steady_samples_per_s": rate,
                    "median_step_ms": 1e3 * gaps[len(gaps) // 2] if gaps else None,
                    "measuring_steps": len(meas),
                    "measuring_step_ms": None if meas_s is None else 1e3 * meas_s,
                    "other_step_ms": None if other_s is None else 1e3 * other_s,
                    # the time measuring added to the run, over the time it would have taken
                    "measuring_overhead_pct": None
                    if meas_s is None or other_s is None
                    else 100.0 * len(meas) * (meas_s - other_s) / (len(timed) * other_s),
                    "global_batch": ctx.batch_size or job["batch_size"],
                    "torch_threads": torch.get_num_threads(),
                    "first_step_end": first_step_end,
                    "last_step_end": time.time(),
                }
            )
        )


def elastic_loop(ctx: Any, job: dict[str, Any]) -> None:
    """Trains digits until the stop file appears (agreed by all ranks at an epoch end);
    checkpoints every epoch so that a resize can restart from it."""
    model = ctx.prepare_model(task_model(job))
    opt = ctx.prepare_optimizer(sgd(model, job))
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        ctx.unwrap_model(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    loader = ctx.prepare_loader(
        tensors(job, "train"),
        batch_size=job["batch_size"],
        shuffle=True,
        seed=job["seed"],
        adaptive=True,
    )
    test = tensors(job, "test")
    loss_fn = nn.CrossEntropyLoss()
    for epoch in ctx.epochs(100_000):
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        ctx.report(
            {"epoch": epoch, "workers": ctx.world_size, "test_accuracy": accuracy(model, test)},
            checkpoint={"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()},
        )
        stop = 1.0 if os.path.exists(job["stop_file"]) else 0.0
        if ctx.all_reduce(stop, op="max") > 0:
            break

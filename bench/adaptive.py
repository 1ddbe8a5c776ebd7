"""python bench/adaptive.py: adaptive vs fixed batch, time to target accuracy, and costs.

Run:  make bench-adaptive   (installs the `bench` and `examples` extras, then runs this file)
      python bench/adaptive.py [--dataset diamonds|digits] [--reps 3] [--resize-reps 2]
                               [--epochs N] [--target ACC]
      python bench/adaptive.py --quick   (smoke run: a quarter of the epochs, target - 5 points)

The time-to-target job (--dataset, no download either way):
  diamonds (default)  plotnine's bundled diamonds: the 5-class cut from 22 numeric and
                      one-hot columns, 43,940 training / 10,000 held-out rows; MLP
                      22 -> 64 -> 64 -> 5; budget 8 epochs, target 75% (a fixed batch of 32
                      needs about 5 epochs, 1,373 steps each)
  digits              scikit-learn's 8x8 digits, 1,347 / 450 images; MLP 64 -> 128 -> 10;
                      budget 40 epochs, target 95% (a fixed batch needs about 13 epochs of
                      42 steps: about a second of training, too short for the engine to
                      profile before the target)
SGD (lr 0.01, momentum 0.9), initial global batch 32, 2 workers of 1 CPU and 1 torch
thread, DDP over gloo; the same for every system, with model init and data order seeded
by the repetition. Every epoch each system evaluates held-out accuracy on the same test
split. Every run trains the same budget in scale-invariant steps (AdaScale): --epochs
epochs of optimizer steps at the initial batch, counted as steps by the fixed runs and as
the adaptive optimizer's progress (the sum of its gains) by the adaptive run, which
therefore runs more, shorter epochs; the LR drops 10x at --lr-decay-at of the budget. The adaptive run may grow the global
batch to 512 (local_batch_bounds (8, 256)) and decides every 0.5 s (the default 3 s is
long against runs this short). The resize measurements always use digits.

  raylight_fixed     raylight.fit, fixed global batch (no adaptive=)
  ray_train_fixed    Ray Train's TorchTrainer, prepare_model / prepare_data_loader,
                     ray.train.report every epoch (with Ray Train V2's defaults a report
                     waits while the previous one is undrained: the controller polls every
                     2 s, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, so short epochs last 2 s)
  raylight_adaptive  raylight.fit(adaptive=AdaptiveConfig(..., lr_rule="adascale")),
                     ctx.prepare_optimizer, ctx.prepare_loader(..., adaptive=True)

Every run is its own child process started cold (its own local Ray), systems interleaved
across repetitions, medians reported. Rank 0 writes wall-clock timestamps; against the
moment the parent launched the child they give, identically for all systems:

  to_target_from_launch_s      launch -> the end of the first evaluation at or above the
                               target accuracy (interpreter, Ray and worker start included)
  to_target_from_first_step_s  start of the first training step -> the same evaluation
                               (start-up separated out: training time only)
  final_accuracy               held-out accuracy once the budget is spent (the adaptive
                               run's accuracy after as many epochs as the fixed runs is
                               accuracy_at_epoch_budget)

Also measured, each in child processes of its own:

  noise overhead     on a bigger MLP (64 -> 512 -> 512 -> 10), raylight adaptive with the
                     batch pinned at the initial size: the time its noise-measuring steps
                     (1 in control_interval_steps) add over its other steps, timed in the
                     same run (median over runs). Beside it, adaptive overhead: steady
                     samples/s of raylight fixed vs pinned (the whole adaptive machinery:
                     measurement, plan agreement, the driver's polls and fits); per
                     repetition, --tput-blocks blocks of runs fixed, pinned, pinned, fixed;
                     the median of the blocks' overheads
  resize latency     an elastic job num_workers=(1, 2), scaling_policy="max", started while
                     a blocker actor holds one of the 2 CPUs; after the first checkpoint the
                     blocker is killed and the job grows 1 -> 2, in place or from the
                     checkpoint. result.resizes gives first_step_s (decision -> rank 0's first
                     batch at the new size, by rank 0's own clock stamp), pause_s (old workers
                     told to stop -> that batch) and, in place, the phases spawn/warm/stop/launch.
  prediction error   on held-out steps: at each decision of the adaptive runs, the
                     engine's predicted seconds per optimizer step for the running plan
                     (adaptive.jsonl's predicted_step_time) against the mean over the steps
                     up to the next decision (the next row's measured_step_time: steps
                     after the fit it predicted with), weighted by those steps; intervals
                     where the plan changed or with fewer than 5 steps are left out.
                     Also given, for unseen layouts: leave-one-layout-out on the profile
                     in adaptive_state.json (for each layout with at least 5 optimizer
                     steps, fit_perf_params on the other layouts, predict its mean seconds
                     per optimizer step). When no adaptive run saw 3 such layouts, layouts
                     are forced: short adaptive runs pinned at atomic batches 4, 8, 16, 64
                     and 256 (one Ray session), their profiles merged.

adaptive_vs_fixed_time_to_target is raylight fixed over raylight adaptive, medians of
to_target_from_first_step_s (both pay the same start-up; the from-launch ratio is also
given). A run that misses the target counts as slower than any that reached it. The
1-minute load average before and after each child is recorded: other work on the machine
distorts the timings.

Results: a table on stdout, bench/results/adaptive.json (named figures, goals, medians, raw
repetitions, machine info) and bench/results/adaptive.png (the adaptive trace of the median
adaptive repetition); --quick writes adaptive-quick.json / adaptive-quick.png instead.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_WORKERS = 2
RESULTS_DIR = Path(__file__).resolve().parent / "results"
TTT_SYSTEMS = ("raylight_fixed", "ray_train_fixed", "raylight_adaptive")
TPUT_SYSTEMS = ("raylight_fixed", "raylight_pinned")
# in_place: a warm spare process waits beside rank 0 (the default); in_place_cold: none
# (warm_spare=False), the new worker starts and imports when the grow is decided.
RESIZE_KINDS = ("in_place", "in_place_cold", "checkpoint")
PHASES = ("spawn_s", "warm_s", "stop_s", "launch_s", "spares")  # of an in-place resize
DEFAULT_BUDGET = {"diamonds": (8, 0.75), "digits": (40, 0.95)}  # epochs, target
SKIP_STEPS = 20  # steps left out of steady throughput
MIN_PROFILE_STEPS = 5  # optimizer steps a layout needs to count (the engine's default)
SWEEP_ATOMIC = (4, 8, 16, 64, 256)  # forced layouts, when the adaptive runs saw too few

GOAL_SPEEDUP = 2.0  # adaptive reaches the target at least this many times sooner
GOAL_ACC_PTS = -0.5  # ... with final accuracy no more than 0.5 points below fixed
GOAL_PRED_ERR = 0.10
GOAL_RESIZE_S = 1.0
GOAL_NOISE_PCT = 5.0


# -- the jobs (run inside the workers) ------------------------------------------------


DATASETS = {
    "diamonds": "plotnine's bundled diamonds (53,940 rows): predict the 5-class cut from carat, "
    "depth, table, price, x, y, z (z-scored) and one-hot colour and clarity; 43,940 training and "
    "10,000 held-out rows (a fixed random split, seed 0); MLP 22 -> 64 -> 64 -> 5",
    "digits": "scikit-learn's bundled 8x8 digits: 1,347 training and 450 held-out images "
    "(stratified, random_state=0); MLP 64 -> 128 -> 10",
}


def dataset_arrays(name: str, seed: int) -> tuple[Any, Any, Any, Any]:
    """(x_train, y_train, x_test, y_test) as numpy arrays; every process loads its own copy
    from the installed package (no download, nothing shipped through the config), once."""
    cache = sys.modules[__name__].__dict__.setdefault("_DATASET_CACHE", {})
    if (name, seed) not in cache:
        cache[(name, seed)] = _load_arrays(name, seed)
    return cache[(name, seed)]


def _load_arrays(name: str, seed: int) -> tuple[Any, Any, Any, Any]:
    import numpy as np

    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_tr, x_te, y_tr, y_te = train_test_split(
            digits.data / 16.0,
            digits.target,
            test_size=0.25,
            random_state=seed,
            stratify=digits.target,
        )
        return x_tr, y_tr, x_te, y_te
    if name == "diamonds":
        import pandas as pd
        import plotnine

        df = pd.read_csv(Path(plotnine.__file__).parent / "data" / "diamonds.csv")
        y = pd.Categorical(df["cut"]).codes.astype(np.int64)
        num = df[["carat", "depth", "table", "price", "x", "y", "z"]].astype(float)
        num = (num - num.mean()) / num.std()
        x = pd.concat(
            [num, pd.get_dummies(df["color"]), pd.get_dummies(df["clarity"])], axis=1
        ).to_numpy(np.float32)
        order = np.random.default_rng(seed).permutation(len(x))
        test, train = order[:10_000], order[10_000:]
        return x[train], y[train], x[test], y[test]
    raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")


def tensors(job: dict[str, Any], part: str) -> TensorDataset:
    x_tr, y_tr, x_te, y_te = dataset_arrays(job["dataset"], job["split_seed"])
    x, y = (x_tr, y_tr) if part == "train" else (x_te, y_te)
    return TensorDataset(
        torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)
    )


def task_model(job: dict[str, Any]) -> nn.Module:
    torch.manual_seed(job["seed"])
    if job["dataset"] == "digits":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Linear(22, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)
    )


def accuracy(model: nn.Module, test: TensorDataset) -> float:
    module = getattr(model, "module", model)  # the DDP wrapper is not needed to evaluate
    x, y = test.tensors
    with torch.no_grad():
        return float((module(x).argmax(1) == y).float().mean())


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


def sgd(model: nn.Module, job: dict[str, Any]) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])


def max_epochs(job: dict[str, Any]) -> int:
    """Epochs a run may take to spend its budget: the budget at the largest batch with no
    gain at all (AdaScale's gain is at least 1 per step, so never more)."""
    return job["epochs"] * math.ceil(
        job.get("max_batch_size", job["batch_size"]) / job["batch_size"]
    )


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


def synthetic(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 64, generator=gen)
    teacher = torch.randn(64, 10, generator=gen)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def throughput_loop(ctx: Any, job: dict[str, Any]) -> None:
    """Steady samples/s on a bigger MLP; the same loop with and without adaptive=."""
    torch.set_num_threads(1)
    torch.manual_seed(job["seed"])
    h = job["hidden"]
    model = ctx.prepare_model(
        nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    )
    opt = ctx.prepare_optimizer(
        torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
    )
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
    opt = ctx.prepare_optimizer(
        torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
    )
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


# -- child processes: one run each ------------------------------------------------------


def adaptive_config(job: dict[str, Any]) -> Any:
    from raylight import AdaptiveConfig

    return AdaptiveConfig(**job["adaptive"]) if job.get("adaptive") else None


def write_driver_info(job: dict[str, Any], result: Any) -> None:
    """What the driver learned, for the parent: resizes and the adaptive state."""
    run_dir = Path(result.path)
    info: dict[str, Any] = {"resizes": result.resizes, "reports": len(result.metrics_history)}
    state = run_dir / "adaptive_state.json"
    if state.exists():
        info["engine_state"] = json.loads(state.read_text())
    trace = run_dir / "adaptive.jsonl"
    if trace.exists():
        rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        info["trace_rows"] = len(rows)
        info["batch_decisions"] = [r.get("reason") for r in rows if r.get("decision") == "batch"]
        info["forward_predictions"] = forward_predictions(rows)
    if (run_dir / "adaptive.png").exists():
        shutil.copy(run_dir / "adaptive.png", Path(job["result_path"]).with_name("adaptive.png"))
    Path(job["result_path"]).with_name("driver.json").write_text(json.dumps(info, default=str))


@contextlib.contextmanager
def embedded_ray(job: dict[str, Any]) -> Iterator[None]:
    """The child's own local Ray (NUM_WORKERS CPUs, the job's temp dir), shut down after."""
    import ray

    from raylight import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    try:
        yield
    finally:
        ray.shutdown()


def bench_fit(
    loop: Callable[..., Any], config: dict[str, Any], adaptive: Any, storage_path: str, name: str
) -> Any:
    """One raylight run as every raylight child runs it: NUM_WORKERS workers, no display."""
    import raylight

    return raylight.fit(
        loop,
        config=config,
        num_workers=NUM_WORKERS,
        adaptive=adaptive,
        progress=False,
        storage_path=storage_path,
        name=name,
    )


def child_raylight(job: dict[str, Any]) -> None:
    """raylight_fixed / raylight_adaptive (time to target)."""
    with embedded_ray(job):
        result = bench_fit(
            raylight_ttt_loop, job, adaptive_config(job), job["storage_path"], "bench"
        )
        write_driver_info(job, result)


TPUT_ORDER = ("raylight_fixed", "raylight_pinned", "raylight_pinned", "raylight_fixed")


def child_tput(job: dict[str, Any]) -> None:
    """The throughput pair in one child and one embedded cluster: ``tput_blocks`` blocks,
    each in the order fixed, pinned, pinned, fixed. Rates drift by several percent from
    one run to the next on a shared machine; within a block the drift hits both systems
    alike, and each block's overhead is the ratio of the two systems' mean rates."""
    runs = []
    with embedded_ray(job):
        for block in range(job["tput_blocks"]):
            for system in TPUT_ORDER:
                i = len(runs)
                run_job = dict(job, system=system, result_path=f"{job['result_path']}.{i}")
                adaptive = adaptive_config(job) if system == "raylight_pinned" else None
                cpu = time.process_time()
                bench_fit(throughput_loop, run_job, adaptive, f"{job['storage_path']}/{i}", "bench")
                result = json.loads(Path(run_job["result_path"]).read_text())
                result["driver_cpu_s"] = time.process_time() - cpu
                runs.append({"system": system, "block": block, **result})
    Path(job["result_path"]).write_text(json.dumps({"runs": runs}))


def child_sweep(job: dict[str, Any]) -> None:
    """Forced layouts for the throughput model: short adaptive runs on digits, one per
    atomic batch, each pinned there (local_batch_bounds=(m, m)), in one Ray session; their
    profiles are merged as the engine merges increments."""
    from raylight import AdaptiveConfig
    from raylight.adaptive.profile import StepProfile

    train_size = len(tensors(job, "train"))
    merged = StepProfile()
    runs = []
    with embedded_ray(job):
        for atomic in job["atomic_sizes"]:
            batch = NUM_WORKERS * atomic
            epochs = max(1, math.ceil(job["steps"] * batch / train_size))
            config = dict(job, batch_size=batch, epochs=epochs, system="raylight_adaptive")
            pinned = AdaptiveConfig(
                max_batch_size=batch, local_batch_bounds=(atomic, atomic), accumulation=False
            )
            result = bench_fit(
                raylight_ttt_loop, config, pinned, job["storage_path"], f"sweep-{atomic}"
            )
            state = json.loads((Path(result.path) / "adaptive_state.json").read_text())
            merged.merge(StepProfile.from_json(state["profile"]))
            runs.append({"atomic": atomic, "epochs": epochs, "profile": state["profile"]})
    Path(job["result_path"]).write_text(json.dumps({"profile": merged.to_json(), "runs": runs}))


def child_ray_train(job: dict[str, Any]) -> None:
    from common import run_ray_train

    run_ray_train(ray_train_ttt_loop, job, NUM_WORKERS)


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def child_resize(job: dict[str, Any]) -> None:
    """Grow 1 -> 2 workers: a blocker holds one CPU until the first checkpoint (and, for
    in_place, until the warm spare is ready: the CPU comes back while one waits)."""
    import ray

    import raylight
    from raylight import RunConfig, ScalingConfig, TrainerConfig

    with embedded_ray(job):

        @ray.remote(num_cpus=1)
        class Blocker:
            def ready(self) -> bool:
                return True

        blocker = Blocker.remote()  # type: ignore[attr-defined]
        ray.get(blocker.ready.remote())
        run_dir = Path(job["storage_path"]) / "bench"
        trainer = raylight.Trainer(
            elastic_loop,
            train_loop_config=job,
            config=TrainerConfig(
                scaling=ScalingConfig(
                    num_workers=(1, NUM_WORKERS),
                    scaling_policy="max",
                    resize_interval_s=0.3,
                    resize_in_place=job["resize_kind"] != "checkpoint",
                    warm_spare=job["resize_kind"] == "in_place",
                ),
                run=RunConfig(storage_path=job["storage_path"], name="bench", progress=False),
            ),
        )
        out: dict[str, Any] = {}

        def fit() -> None:
            try:
                out["result"] = trainer.fit()
            except BaseException as exc:  # reported by the parent through the exit code
                out["error"] = exc

        thread = threading.Thread(target=fit, name="fit")
        thread.start()
        events: dict[str, float] = {}
        try:
            trace = run_dir / "adaptive.jsonl"

            def ready_to_grow() -> bool:
                if not thread.is_alive():
                    return True
                if not any(run_dir.glob("checkpoints/*/meta.json")):
                    return False
                return job["resize_kind"] != "in_place" or (
                    trace.exists() and '"event": "spare_ready"' in trace.read_text()
                )

            if _wait_for(ready_to_grow, 120):
                events["blocker_killed"] = time.time()
                ray.kill(blocker)

                def resized() -> bool:
                    return (
                        trace.exists() and '"event": "resized"' in trace.read_text()
                    ) or not thread.is_alive()

                _wait_for(resized, 120)
        finally:
            Path(job["stop_file"]).touch()
            thread.join(180)
        if "error" in out:
            raise out["error"]
        result = out["result"]
        write_driver_info(job, result)
        workers = [m.get("workers") for m in result.metrics_history]
        Path(job["result_path"]).write_text(
            json.dumps({"events": events, "workers_per_epoch": workers})
        )


CHILDREN = {
    "raylight": child_raylight,
    "ray_train": child_ray_train,
    "resize": child_resize,
    "sweep": child_sweep,
    "tput": child_tput,
}


# -- the parent: launch, time, clean up -------------------------------------------------


def source_fingerprint() -> str:
    """A hash of raylight's Python sources as the children will import them: a run whose
    fingerprint changed measured a tree that someone edited meanwhile."""
    import hashlib
    from importlib.util import find_spec

    spec = find_spec("raylight")
    root = Path(next(iter(spec.submodule_search_locations or []))) if spec else None
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")) if root else []:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run_child(child: str, base_job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Launch one cold child process; returns its record with the launch timestamp."""
    from common import child_env, reap_leftovers, stop_group, tail

    run_dir = Path(tempfile.mkdtemp(prefix="rla-", dir="/tmp"))  # short: Ray's socket paths
    job = dict(
        base_job,
        result_path=str(run_dir / "result.json"),
        ray_temp_dir=str(run_dir / "r"),
        storage_path=str(run_dir / "storage"),
        stop_file=str(run_dir / "stop"),
    )
    stderr = run_dir / "stderr.log"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        child,
        "--job",
        json.dumps(job),
    ]
    # 1-minute load average around the run: other work on the machine shows up here.
    record: dict[str, Any] = {"ok": False, "loadavg_before": os.getloadavg()[0]}
    record["raylight_source"] = source_fingerprint()
    with (run_dir / "stdout.log").open("wb") as out, stderr.open("wb") as err:
        launched = time.time()
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, env=child_env(), start_new_session=True
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            returncode = None
        record["process_s"] = time.time() - launched
    record["loadavg_after"] = os.getloadavg()[0]
    if source_fingerprint() != record["raylight_source"]:
        record["raylight_source_changed"] = True  # edited while this child ran
    record["leftover_pids"] = reap_leftovers(proc.pid, str(run_dir))
    raw: dict[str, Any] = {}
    try:
        raw = json.loads(Path(job["result_path"]).read_text())
        driver = run_dir / "driver.json"
        if driver.exists():
            raw["driver"] = json.loads(driver.read_text())
        png = run_dir / "adaptive.png"
        if png.exists():
            record["_png"] = png.read_bytes()  # kept in memory only
    except (OSError, ValueError):
        pass
    if returncode is None:
        record["error"] = f"timed out after {timeout_s:.0f}s"
    elif returncode != 0:
        record["error"] = f"exit code {returncode}"
    elif not raw:
        record["error"] = "the run wrote no result"
    record["launched"] = launched
    record["raw"] = raw
    if "error" in record:
        record["stderr_tail"] = tail(stderr)
        record["run_dir"] = str(run_dir)  # kept for a look
    else:
        record["ok"] = True
        shutil.rmtree(run_dir, ignore_errors=True)
    return record


def ttt_record(system: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    record = run_child(
        "ray_train" if system == "ray_train_fixed" else "raylight",
        dict(job, system=system),
        timeout_s,
    )
    record["system"] = system
    raw, launched = record.pop("raw"), record.pop("launched")
    if not record["ok"]:
        return record
    epochs = raw["epochs"]
    if raw.get("first_batch") is None or not epochs:
        record.update(ok=False, error="no training step was taken")
        return record
    hit = next((e for e in epochs if e["accuracy"] >= job["target"]), None)
    last = epochs[-1]
    record.update(
        start_to_first_step_s=raw["first_step_end"] - launched,
        reached_target=hit is not None,
        to_target_from_launch_s=None if hit is None else hit["time"] - launched,
        to_target_from_first_step_s=None if hit is None else hit["time"] - raw["first_batch"],
        epochs_to_target=None if hit is None else hit["epoch"] + 1,
        final_accuracy=last["accuracy"],
        best_accuracy=max(e["accuracy"] for e in epochs),
        # after the same number of epochs as the fixed runs (their final accuracy)
        accuracy_at_epoch_budget=epochs[min(job["epochs"], len(epochs)) - 1]["accuracy"],
        epochs_trained=len(epochs),
        final_progress=last["progress"],
        training_s=last["time"] - raw["first_batch"],
        micro_steps=last["micro_steps"],
        final_global_batch=last["global_batch"],
        torch_threads=raw["torch_threads"],
        accuracy_per_epoch=[round(e["accuracy"], 4) for e in epochs],
        global_batch_per_epoch=[e["global_batch"] for e in epochs],
        seconds_per_epoch=[round(e["time"] - raw["first_batch"], 3) for e in epochs],
    )
    driver = raw.get("driver", {})
    if "engine_state" in driver:
        record["engine_state"] = driver["engine_state"]
        record["batch_decisions"] = driver.get("batch_decisions", [])
        record["forward_predictions"] = driver.get("forward_predictions", [])
    return record


def tput_record(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One repetition of the throughput pair: per-system runs and each block's ratio."""
    record = run_child("tput", job, timeout_s)
    raw = record.pop("raw")
    record.pop("launched")
    record.pop("_png", None)
    if record["ok"]:
        runs = raw["runs"]
        record["runs"] = runs
        per_block = []
        for block in sorted({r["block"] for r in runs}):
            rate = {
                system: statistics.mean(
                    r["steady_samples_per_s"]
                    for r in runs
                    if r["system"] == system and r["block"] == block
                )
                for system in TPUT_SYSTEMS
            }
            per_block.append(100.0 * (rate["raylight_fixed"] / rate["raylight_pinned"] - 1.0))
        record["overhead_pct_per_block"] = per_block
        record["overhead_pct"] = statistics.median(per_block)
        per_run = [
            r["measuring_overhead_pct"]
            for r in runs
            if r["system"] == "raylight_pinned" and r["measuring_overhead_pct"] is not None
        ]
        record["measuring_overhead_pct_per_run"] = per_run
        record["measuring_overhead_pct"] = statistics.median(per_run) if per_run else None
    return record


def resize_record(kind: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    record = run_child("resize", dict(job, resize_kind=kind), timeout_s)
    record["kind"] = kind
    raw = record.pop("raw")
    record.pop("launched")
    record.pop("_png", None)
    if not record["ok"]:
        return record
    resizes = raw.get("driver", {}).get("resizes", [])
    grow = next((r for r in resizes if (r.get("from"), r.get("to")) == (1, 2)), None)
    record["resizes"] = resizes
    record["workers_per_epoch"] = raw.get("workers_per_epoch")
    if grow is None:
        record.update(ok=False, error=f"no 1 -> 2 resize happened (resizes: {resizes})")
        return record
    record.update(
        resize_kind_seen=grow["kind"],
        first_step_s=grow.get("first_step_s"),
        pause_s=grow.get("pause_s"),
        **{f"{k}": v for k, v in grow.get("phases", {}).items()},
    )
    want = "checkpoint" if kind == "checkpoint" else "in_place"
    if grow["kind"] != want:
        record.update(ok=False, error=f"asked for a {want} resize, got {grow['kind']}")
    elif kind == "in_place" and not grow.get("phases", {}).get("spares"):
        record.update(ok=False, error="the grow did not use the warm spare")
    return record


# -- the throughput model's prediction error ----------------------------------------------


PLAN_KEYS = ("workers", "threads", "atomic_bsz", "accum_steps")


def forward_predictions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each decision row's predicted seconds per optimizer step for the running plan,
    against the mean measured over the steps up to the next row (held out: they came
    after the fit it predicted with), where the plan did not change in between."""
    rows = [r for r in rows if "event" not in r]
    pairs = []
    for row, later in itertools.pairwise(rows):
        if "predicted_step_time" not in row or "measured_step_time" not in later:
            continue
        if any(row.get(k) != later.get(k) for k in PLAN_KEYS):
            continue
        if later["measured_steps"] < MIN_PROFILE_STEPS:
            continue
        measured, predicted = later["measured_step_time"], row["predicted_step_time"]
        pair = {
            **{k: row[k] for k in PLAN_KEYS},
            "steps": later["measured_steps"],
            "predicted_s": predicted,
            "measured_s": measured,
            "relative_error": abs(predicted - measured) / measured,
        }
        # The naive prediction beside it: the interval before the decision, at this plan.
        if row.get("measured_steps", 0) >= MIN_PROFILE_STEPS:
            last = row["measured_step_time"]
            pair.update(last_interval_s=last, last_interval_error=abs(last - measured) / measured)
        pairs.append(pair)
    return pairs


def forward_summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-weighted mean relative errors of the forward predictions, and, over the
    intervals that have one, of the naive last-interval prediction beside the model's."""

    def weighted(rows: list[dict[str, Any]], key: str) -> float | None:
        steps = sum(p["steps"] for p in rows)
        return sum(p[key] * p["steps"] for p in rows) / steps if steps else None

    paired = [p for p in pairs if "last_interval_error" in p]
    return {
        "mean_relative_error": weighted(pairs, "relative_error"),
        "median_interval_relative_error": statistics.median(p["relative_error"] for p in pairs)
        if pairs
        else None,
        "intervals": len(pairs),
        "steps": sum(p["steps"] for p in pairs),
        "last_interval": {
            "mean_relative_error": weighted(paired, "last_interval_error"),
            "model_mean_relative_error": weighted(paired, "relative_error"),
            "intervals": len(paired),
        },
    }


def leave_one_layout_out(
    profile_rows: list[list[Any]], min_steps: int = MIN_PROFILE_STEPS
) -> dict[str, Any]:
    """For each layout with at least ``min_steps`` optimizer steps (of the most common
    thread count), fit the throughput model on the other such layouts and predict its
    mean seconds per optimizer step (accumulation micro-steps included)."""
    from raylight.adaptive.goodput import predict_step_time
    from raylight.adaptive.perf_model import fit_perf_params
    from raylight.adaptive.profile import StepProfile

    profile = StepProfile.from_json(profile_rows)
    usable = {k: s for k, s in profile.layouts.items() if s.optim_count >= min_steps}
    if not usable:
        return {"layouts": [], "usable_layouts": 0}
    counts: dict[int, int] = {}
    for _, _, _, t in usable:
        counts[t] = counts.get(t, 0) + 1
    threads = max(counts, key=lambda t: counts[t])
    layouts = sorted(k for k in usable if k[3] == threads)
    rows = []
    for held in layouts:
        others = StepProfile({k: profile.layouts[k] for k in layouts if k != held})
        obs = others.observations(threads=threads, min_steps=min_steps)
        if len(obs.num_nodes) < 2:  # one layout cannot tell fixed from per-sample costs
            continue
        params = fit_perf_params(**obs._asdict())
        stats = profile.layouts[held]
        accum = stats.accum_count / stats.optim_count
        measured = stats.step_time
        nodes, replicas, atomic, _ = held
        predicted = float(predict_step_time(params, nodes, replicas, atomic, accum))
        rows.append(
            {
                "layout": list(held),
                "optim_steps": stats.optim_count,
                "accum_steps_per_step": accum,
                "measured_s": measured,
                "predicted_s": predicted,
                "relative_error": abs(predicted - measured) / measured,
            }
        )
    return {"layouts": rows, "usable_layouts": len(layouts), "threads": threads}


def prediction_error(profiles: list[tuple[str, list[list[Any]]]]) -> dict[str, Any]:
    """Mean relative error over every held-out layout of every profile given."""
    per_run = []
    errors: list[float] = []
    for source, rows in profiles:
        lolo = leave_one_layout_out(rows)
        lolo["source"] = source
        per_run.append(lolo)
        errors.extend(r["relative_error"] for r in lolo["layouts"])
    return {
        "mean_relative_error": statistics.fmean(errors) if errors else None,
        "median_relative_error": statistics.median(errors) if errors else None,
        "held_out_predictions": len(errors),
        "runs": per_run,
    }


# -- summary ----------------------------------------------------------------------------


def median_of(
    records: list[dict[str, Any]], key: str, missing_as_inf: bool = False
) -> float | None:
    """Median over successful records; with ``missing_as_inf`` a missing value (target not
    reached) counts as slower than any, so the median is None when most runs missed."""
    values = []
    for r in records:
        if not r["ok"]:
            continue
        value = r.get(key)
        if value is None and missing_as_inf:
            value = math.inf
        if value is not None:
            values.append(value)
    if not values:
        return None
    med = statistics.median(values)
    return None if math.isinf(med) else med


TPUT_METRICS = ("steady_samples_per_s", "median_step_ms")
TTT_METRICS = (
    "start_to_first_step_s",
    "to_target_from_launch_s",
    "to_target_from_first_step_s",
    "epochs_to_target",
    "final_accuracy",
    "accuracy_at_epoch_budget",
    "epochs_trained",
    "best_accuracy",
    "training_s",
    "micro_steps",
    "final_global_batch",
    "process_s",
)


def summarize_ttt(reps: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out = {}
    for name, records in reps.items():
        med = {
            m: median_of(records, m, missing_as_inf=m.startswith(("to_target", "epochs_to")))
            for m in TTT_METRICS
        }
        out[name] = {
            "median": med,
            "ok_reps": sum(r["ok"] for r in records),
            "reached_target": sum(bool(r.get("reached_target")) for r in records),
            "reps": records,
        }
    return out


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def figures(
    ttt: dict[str, Any], tput: dict[str, Any], resize: dict[str, Any], pred: dict[str, Any]
) -> dict[str, Any]:
    fixed, adapt = ttt["raylight_fixed"]["median"], ttt["raylight_adaptive"]["median"]
    speedup = ratio(fixed["to_target_from_first_step_s"], adapt["to_target_from_first_step_s"])
    speedup_launch = ratio(fixed["to_target_from_launch_s"], adapt["to_target_from_launch_s"])
    delta = None
    if fixed["final_accuracy"] is not None and adapt["final_accuracy"] is not None:
        delta = 100.0 * (adapt["final_accuracy"] - fixed["final_accuracy"])
    overhead = tput["median_measuring_overhead_pct"]
    adaptive_overhead = tput["median_overhead_pct"]
    in_place = resize["in_place"]["median"]
    cold = resize["in_place_cold"]["median"]
    from_ckpt = resize["checkpoint"]["median"]
    err = pred["forward"]["mean_relative_error"]
    unseen = pred["mean_relative_error"]
    naive = pred["forward"]["last_interval"]
    return {
        "definitions": {
            "adaptive_vs_fixed_time_to_target": "median to_target_from_first_step_s of "
            "raylight_fixed / the same of raylight_adaptive",
            "adaptive_vs_fixed_time_to_target_from_launch": "the same with to_target_from_launch_s",
            "final_accuracy_delta_pts": "100 x (median final accuracy of raylight_adaptive "
            "- that of raylight_fixed), after the epoch budget",
            "step_time_prediction_error": "mean relative error over held-out steps: at each "
            "decision of the adaptive runs, the engine's predicted seconds per optimizer step "
            "for the running plan against the mean over the steps up to the next decision "
            "(after the fit it predicted with), weighted by those steps; intervals where the "
            "plan changed, or with fewer than 5 steps, are left out",
            "step_time_prediction_error_last_interval": "the same error for a naive "
            "prediction, the mean over the interval before the decision at the same plan, "
            "on the intervals that have one (the model's error on those same intervals: "
            "prediction.forward.last_interval.model_mean_relative_error); how much the "
            "machine's speed moves from one interval to the next",
            "step_time_prediction_error_unseen_layouts": "mean relative error of "
            "leave-one-layout-out predictions (each layout a run visited, predicted by a fit "
            "to its other layouts)",
            "resize_*_s": "median first_step_s (resize decision -> rank 0's first batch at 2 "
            "workers); *_pause_s: median pause_s (stop -> that batch: training time lost); "
            "in_place: the warm spare joins (the CPU returns after it is ready); "
            "in_place_cold: warm_spare=False, a new process starts",
            "noise_overhead_pct": "median over the raylight_pinned runs of the time the "
            "noise-measuring steps added to the run: 100 x n_measuring x (mean measuring "
            "step - mean other step) / (n_steps x mean other step), steps timed on rank 0 "
            "after the first 20; measuring and other steps interleave (1 in "
            "control_interval_steps), so drift of the machine hits both alike",
            "adaptive_overhead_pct": "the whole adaptive machinery against none (noise "
            "measurement, plan agreement, the driver's polls and fits): median over blocks "
            "of 100 x (raylight_fixed mean steady samples/s / raylight_pinned mean steady "
            "samples/s - 1), each block the runs fixed, pinned, pinned, fixed in a row; each "
            "repetition one child running --tput-blocks blocks on one embedded cluster",
        },
        "adaptive_vs_fixed_time_to_target": speedup,
        "adaptive_vs_fixed_time_to_target_from_launch": speedup_launch,
        "final_accuracy_delta_pts": delta,
        "step_time_prediction_error": err,
        "step_time_prediction_error_last_interval": naive["mean_relative_error"],
        "step_time_prediction_error_unseen_layouts": unseen,
        "resize_in_place_s": in_place["first_step_s"],
        "resize_in_place_pause_s": in_place["pause_s"],
        "resize_in_place_cold_s": cold["first_step_s"],
        "resize_in_place_cold_pause_s": cold["pause_s"],
        "resize_from_checkpoint_s": from_ckpt["first_step_s"],
        "resize_from_checkpoint_pause_s": from_ckpt["pause_s"],
        "noise_overhead_pct": overhead,
        "adaptive_overhead_pct": adaptive_overhead,
        "goals": {
            "time_to_target": {
                "goal": f"adaptive_vs_fixed_time_to_target >= {GOAL_SPEEDUP} and "
                f"final_accuracy_delta_pts >= {GOAL_ACC_PTS}",
                "met": None
                if speedup is None or delta is None
                else speedup >= GOAL_SPEEDUP and delta >= GOAL_ACC_PTS,
            },
            "step_time_prediction_error": {
                "goal": f"< {GOAL_PRED_ERR}",
                "met": None if err is None else err < GOAL_PRED_ERR,
            },
            "resize_in_place_s": {
                "goal": f"< {GOAL_RESIZE_S} s",
                "met": None
                if in_place["first_step_s"] is None
                else in_place["first_step_s"] < GOAL_RESIZE_S,
            },
            "noise_overhead_pct": {
                "goal": f"< {GOAL_NOISE_PCT}%",
                "met": None if overhead is None else overhead < GOAL_NOISE_PCT,
            },
        },
    }


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: dict[str, Any]) -> None:
    cfg, ttt = results["config"], results["time_to_target"]
    print(
        f"\nTime to {100 * cfg['target']:.0f}% held-out accuracy, {cfg['dataset'].split(':')[0]}, {cfg['epochs']}-epoch budget "
        f"(medians of {cfg['reps']} reps)"
    )
    print(
        f"{'system':<18} {'ok':>4} {'hit':>4} {'start->1st s':>12} {'target from':>12} {'target from':>12} "
        f"{'epochs to':>10} {'final acc':>10} {'train s':>8} {'final':>6}"
    )
    print(
        f"{'':<18} {'':>4} {'':>4} {'':>12} {'launch s':>12} {'1st step s':>12} {'target':>10} {'%':>10} {'':>8} {'batch':>6}"
    )
    for name, s in ttt.items():
        m = s["median"]
        print(
            f"{name:<18} {s['ok_reps']}/{len(s['reps']):<2} {s['reached_target']:>4} "
            f"{fmt(m['start_to_first_step_s'], '.2f'):>12} {fmt(m['to_target_from_launch_s'], '.2f'):>12} "
            f"{fmt(m['to_target_from_first_step_s'], '.2f'):>12} {fmt(m['epochs_to_target'], '.0f'):>10} "
            f"{fmt(None if m['final_accuracy'] is None else 100 * m['final_accuracy'], '.2f'):>10} "
            f"{fmt(m['training_s'], '.2f'):>8} {fmt(m['final_global_batch'], '.0f'):>6}"
        )
    tput = results["noise_overhead"]
    print(
        f"\nSteady throughput, MLP 64-{cfg['tput_hidden']}-{cfg['tput_hidden']}-10, global batch {cfg['batch_size']}"
    )
    for name, s in tput["systems"].items():
        m = s["median"]
        print(
            f"{name:<18} {s['runs']:>2} runs {fmt(m['steady_samples_per_s'], ',.0f'):>10} samples/s "
            f"{fmt(m['median_step_ms'], '.2f'):>7} ms/step"
        )
    per_block = ", ".join(fmt(v, ".1f") for v in tput["overhead_pct_per_block"])
    print(f"adaptive overhead per block of fixed, pinned, pinned, fixed (%): {per_block}")
    per_run = ", ".join(fmt(v, ".1f") for v in tput["measuring_overhead_pct_per_run"])
    print(f"noise-measurement overhead per pinned run (%): {per_run}")
    print(
        "\nResize 1 -> 2 workers (decision -> first step at the new size; pause = stop -> first step)"
    )
    for kind, s in results["resize"].items():
        m = s["median"]
        print(
            f"{kind:<18} {s['ok_reps']}/{len(s['reps']):<2} first step {fmt(m['first_step_s'], '.2f'):>6} s  "
            f"pause {fmt(m['pause_s'], '.2f'):>6} s  "
            + "  ".join(
                f"{k.removesuffix('_s')} {fmt(m.get(k), '.2f')}"
                for k in PHASES
                if m.get(k) is not None
            )
        )
    source = results["raylight_source"]
    if source["at_start"] != source["at_end"]:
        print(
            f"\nWARNING: raylight's source changed during the benchmark ({source['at_start']} -> "
            f"{source['at_end']}); see raylight_source in each repetition"
        )
    pred = results["prediction"]
    fwd = pred["forward"]
    print(
        f"\nStep-time prediction: {fwd['intervals']} decision intervals ahead ({fwd['steps']} "
        f"held-out steps); {pred['held_out_predictions']} layouts left out "
        f"from {', '.join(r['source'] for r in pred['runs'] if r['layouts']) or 'no run'}"
        + (
            " (forced layouts added: the time-to-target runs saw too few)"
            if pred.get("forced_layouts")
            else ""
        )
    )
    naive = fwd.get("last_interval")
    if naive and naive["intervals"]:
        print(
            f"  on the {naive['intervals']} intervals that follow one at the same plan: the model "
            f"{fmt(naive['model_mean_relative_error'], '.3f')}, the last interval's mean "
            f"{fmt(naive['mean_relative_error'], '.3f')}"
        )
    fig = results["figures"]
    goals = fig["goals"]
    print("\nfigure                                       measured   goal")
    rows = [
        (
            "adaptive_vs_fixed_time_to_target",
            fig["adaptive_vs_fixed_time_to_target"],
            ".2f",
            goals["time_to_target"],
        ),
        ("  (from launch)", fig["adaptive_vs_fixed_time_to_target_from_launch"], ".2f", None),
        ("final_accuracy_delta_pts", fig["final_accuracy_delta_pts"], "+.2f", None),
        (
            "step_time_prediction_error",
            fig["step_time_prediction_error"],
            ".3f",
            goals["step_time_prediction_error"],
        ),
        ("  (naive: the last interval)", fig["step_time_prediction_error_last_interval"], ".3f", None),
        ("  (unseen layouts)", fig["step_time_prediction_error_unseen_layouts"], ".3f", None),
        ("resize_in_place_s", fig["resize_in_place_s"], ".2f", goals["resize_in_place_s"]),
        ("  pause_s", fig["resize_in_place_pause_s"], ".2f", None),
        ("resize_in_place_cold_s", fig["resize_in_place_cold_s"], ".2f", None),
        ("  pause_s", fig["resize_in_place_cold_pause_s"], ".2f", None),
        ("resize_from_checkpoint_s", fig["resize_from_checkpoint_s"], ".2f", None),
        ("  pause_s", fig["resize_from_checkpoint_pause_s"], ".2f", None),
        ("noise_overhead_pct", fig["noise_overhead_pct"], ".1f", goals["noise_overhead_pct"]),
        ("adaptive_overhead_pct (all of adaptive)", fig["adaptive_overhead_pct"], ".1f", None),
    ]
    for name, value, spec, goal in rows:
        note = (
            ""
            if goal is None
            else f"{goal['goal']}: {'met' if goal['met'] else 'NOT met' if goal['met'] is False else '-'}"
        )
        print(f"{name:<44} {fmt(value, spec):>9}   {note}")
    failed = [
        (f"time_to_target/{n}", r) for n, s in results["time_to_target"].items() for r in s["reps"]
    ]
    failed += [(f"resize/{n}", r) for n, s in results["resize"].items() for r in s["reps"]]
    failed += [("noise_overhead", r) for r in results["noise_overhead"]["reps"]]
    for section, rep in failed:
        if not rep["ok"]:
            print(f"  {section} FAILED: {rep['error']}\n    " + rep.get("stderr_tail", "")[-600:])


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    adaptive = {
        "max_batch_size": args.max_batch_size,
        "local_batch_bounds": [
            args.batch_size // NUM_WORKERS // 2,
            args.max_batch_size // NUM_WORKERS,
        ],
        "lr_rule": "adascale",
        "decision_interval_s": args.decision_interval,
    }
    half = args.batch_size // NUM_WORKERS
    pinned = {
        "max_batch_size": args.batch_size,
        "local_batch_bounds": [half, half],
        "accumulation": False,
    }
    common = {
        "batch_size": args.batch_size,
        "lr": args.lr,
        "momentum": args.momentum,
        "split_seed": 0,
        "dataset": args.dataset,
    }
    ttt_job = dict(
        common,
        kind="ttt",
        epochs=args.epochs,
        target=args.target,
        lr_decay_at=args.lr_decay_at,
        max_batch_size=args.max_batch_size,
    )
    tput_job = dict(
        common,
        kind="tput",
        samples=args.tput_samples,
        hidden=args.tput_hidden,
        tput_blocks=args.tput_blocks,
    )
    sections = set(args.sections.split(","))
    source_at_start = source_fingerprint()
    ttt_reps: dict[str, list[dict[str, Any]]] = {s: [] for s in TTT_SYSTEMS}
    tput_reps: list[dict[str, Any]] = []
    resize_reps: dict[str, list[dict[str, Any]]] = {k: [] for k in RESIZE_KINDS}

    def show(label: str, record: dict[str, Any]) -> None:
        extra = ""
        if record["ok"] and "to_target_from_first_step_s" in record:
            extra = (
                f", target after {fmt(record['to_target_from_first_step_s'], '.2f')}s of training"
            )
        elif record["ok"] and "first_step_s" in record:
            extra = f", first step after {fmt(record['first_step_s'], '.2f')}s"
        status = (
            f"{record['process_s']:.1f}s{extra}" if record["ok"] else f"FAILED ({record['error']})"
        )
        print(f"{label} {status}", flush=True)

    for rep in range(args.reps):  # interleaved, so drift hits every system alike
        seeded = {"seed": rep}
        if "ttt" in sections:
            for name in TTT_SYSTEMS:
                job = dict(
                    ttt_job, **seeded, adaptive=adaptive if name == "raylight_adaptive" else None
                )
                print(f"rep {rep + 1}/{args.reps}: time to target, {name} ...", end=" ", flush=True)
                ttt_reps[name].append(ttt_record(name, job, args.timeout))
                show("", ttt_reps[name][-1])
        if "tput" in sections:
            job = dict(tput_job, **seeded, adaptive=pinned)
            print(
                f"rep {rep + 1}/{args.reps}: throughput, {' / '.join(TPUT_ORDER)} ...",
                end=" ",
                flush=True,
            )
            tput_reps.append(tput_record(job, args.timeout))
            show("", tput_reps[-1])
            if tput_reps[-1]["ok"]:
                print(
                    f"  noise measurement {fmt(tput_reps[-1]['measuring_overhead_pct'], '.1f')}%, all of adaptive "
                    f"{tput_reps[-1]['overhead_pct']:.1f}%",
                    flush=True,
                )
        if "resize" in sections and rep < args.resize_reps:
            for kind in RESIZE_KINDS:
                print(
                    f"rep {rep + 1}/{args.resize_reps}: resize 1 -> 2, {kind} ...",
                    end=" ",
                    flush=True,
                )
                resize_reps[kind].append(
                    resize_record(kind, dict(common, dataset="digits", **seeded), args.timeout)
                )
                show("", resize_reps[kind][-1])

    ttt = summarize_ttt(ttt_reps)
    # The throughput model: the adaptive time-to-target runs' profiles, plus a wide run
    # when none of them saw enough layouts to leave one out.
    profiles = [
        (f"raylight_adaptive rep {i + 1}", r["engine_state"]["profile"])
        for i, r in enumerate(ttt_reps["raylight_adaptive"])
        if r["ok"] and r.get("engine_state")
    ]
    pred = prediction_error(profiles)
    forward = [
        p
        for r in ttt_reps["raylight_adaptive"]
        if r["ok"]
        for p in r.get("forward_predictions", [])
    ]
    pred["forward"] = forward_summary(forward)
    if "sweep" in sections or (not pred["held_out_predictions"] and "ttt" in sections):
        print(
            "the adaptive runs saw too few layouts to leave one out; forcing layouts "
            f"(atomic batches {', '.join(map(str, SWEEP_ATOMIC))}) ...",
            end=" ",
            flush=True,
        )
        job = dict(common, seed=0, atomic_sizes=list(SWEEP_ATOMIC), steps=args.sweep_steps)
        sweep = run_child("sweep", job, args.timeout)
        raw = sweep.pop("raw")
        sweep.pop("launched")
        sweep.pop("_png", None)
        show("", sweep)
        if sweep["ok"]:
            pred = prediction_error([*profiles, ("forced layouts", raw["profile"])])
            sweep["runs"] = raw["runs"]
        pred["forced_layouts"] = {
            "why": "no time-to-target adaptive run saw 3 layouts with enough steps",
            "atomic_sizes": list(SWEEP_ATOMIC),
            "steps_per_layout": args.sweep_steps,
            "record": sweep,
        }

    # The adaptive trace of the median repetition (by time to target).
    adaptive_ok = [r for r in ttt_reps["raylight_adaptive"] if r["ok"] and r.get("_png")]
    adaptive_ok.sort(key=lambda r: r.get("to_target_from_first_step_s") or math.inf)
    png = adaptive_ok[len(adaptive_ok) // 2]["_png"] if adaptive_ok else None
    for records in ttt_reps.values():
        for r in records:
            r.pop("_png", None)

    tput_runs = {
        name: [
            dict(run, ok=True)
            for r in tput_reps
            if r["ok"]
            for run in r["runs"]
            if run["system"] == name
        ]
        for name in TPUT_SYSTEMS
    }
    blocks = [v for r in tput_reps if r["ok"] for v in r["overhead_pct_per_block"]]
    measuring = [v for r in tput_reps if r["ok"] for v in r["measuring_overhead_pct_per_run"]]
    tput = {
        "systems": {
            name: {"median": {k: median_of(runs, k) for k in TPUT_METRICS}, "runs": len(runs)}
            for name, runs in tput_runs.items()
        },
        "order": TPUT_ORDER,
        "ok_reps": sum(r["ok"] for r in tput_reps),
        "overhead_pct_per_rep": [r.get("overhead_pct") for r in tput_reps],
        "overhead_pct_per_block": blocks,
        "median_overhead_pct": statistics.median(blocks) if blocks else None,
        "measuring_overhead_pct_per_run": measuring,
        "median_measuring_overhead_pct": statistics.median(measuring) if measuring else None,
        "reps": tput_reps,
    }
    resize = {
        kind: {
            "median": {
                k: median_of(r, k) for k in ("first_step_s", "pause_s", "process_s", *PHASES)
            },
            "ok_reps": sum(x["ok"] for x in r),
            "reps": r,
        }
        for kind, r in resize_reps.items()
    }
    from common import machine_info

    results = {
        "config": {
            **common,
            "epochs": args.epochs,
            "target": args.target,
            "reps": args.reps,
            "resize_reps": min(args.resize_reps, args.reps),
            "num_workers": NUM_WORKERS,
            "torch_threads_per_worker": 1,
            "dataset": DATASETS[args.dataset],
            "resize_dataset": DATASETS["digits"],
            "resize_model": "MLP 64-128-10 float32",
            "optimizer": f"SGD lr={args.lr} momentum={args.momentum}",
            "lr_decay_at": args.lr_decay_at,
            "adaptive": adaptive,
            "pinned_adaptive": pinned,
            "tput_hidden": args.tput_hidden,
            "tput_samples": args.tput_samples,
            "tput_blocks": args.tput_blocks,
            "skip_steps": SKIP_STEPS,
            "min_profile_steps": MIN_PROFILE_STEPS,
            "timeout_s": args.timeout,
            "sections": sorted(sections),
            "backend": "gloo (CPU)",
        },
        "machine": machine_info(),
        "raylight_source": {"at_start": source_at_start, "at_end": source_fingerprint()},
        "time_to_target": ttt,
        "noise_overhead": tput,
        "resize": resize,
        "prediction": pred,
    }
    results["figures"] = figures(ttt, tput, resize, pred)
    results["_png"] = png
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument(
        "--resize-reps", type=int, default=2, help="repetitions of each resize kind"
    )
    parser.add_argument(
        "--dataset", choices=sorted(DATASETS), default="diamonds", help="the time-to-target task"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epoch budget (diamonds 8, digits 40)"
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="target held-out accuracy (diamonds 0.75, digits 0.95)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="initial global batch")
    parser.add_argument("--lr", type=float, default=0.01, help="initial learning rate")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument(
        "--lr-decay-at",
        type=float,
        default=0.75,
        help="time to target: the LR drops 10x after this fraction of the budget, in "
        "scale-invariant steps (0: constant LR)",
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=512, help="adaptive: largest global batch"
    )
    parser.add_argument(
        "--decision-interval", type=float, default=0.5, help="adaptive: seconds between decisions"
    )
    parser.add_argument("--tput-hidden", type=int, default=512, help="width of the throughput MLP")
    parser.add_argument(
        "--tput-samples", type=int, default=20_000, help="samples of each throughput run"
    )
    parser.add_argument(
        "--tput-blocks",
        type=int,
        default=4,
        help="blocks of fixed, pinned, pinned, fixed runs per repetition",
    )
    parser.add_argument(
        "--sweep-steps", type=int, default=30, help="steps per forced layout (if needed)"
    )
    parser.add_argument("--sections", default="ttt,tput,resize", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 8 epochs, target 0.9, 1 repetition"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default bench/results/adaptive.json, adaptive-quick.json with --quick)",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    epochs, target = DEFAULT_BUDGET[args.dataset]
    args.epochs = epochs if args.epochs is None else args.epochs
    args.target = target if args.target is None else args.target
    if args.quick:
        args.reps, args.resize_reps = 1, 1
        args.epochs, args.target = max(3, args.epochs // 4), args.target - 0.05
        args.tput_samples, args.sweep_steps, args.tput_blocks = 3_200, 12, 1
    if args.out is None:
        args.out = RESULTS_DIR / ("adaptive-quick.json" if args.quick else "adaptive.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child](json.loads(args.job))
        return
    results = run_benchmark(args)
    png = results.pop("_png")
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results: {args.out}")
    if png is not None:
        png_path = args.out.with_suffix(".png")
        png_path.write_bytes(png)
        print(f"adaptive trace: {png_path}")


if __name__ == "__main__":
    main()

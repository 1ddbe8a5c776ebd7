"""Start-up and throughput overhead: torchrun vs Ray Train vs raylight, side by side.

Run:  make bench                       (installs the `bench` extra, then runs this file)
      python bench/overhead.py [--reps 3] [--samples 60000] [--epochs 2]
      python bench/overhead.py --quick  (smoke run: tiny sizes, 1 repetition)

One job, three systems. The job: an MLP (32 -> 256 -> 256 -> 10, float32) trained
with DDP over gloo on 2 CPU workers (1 torch thread each), SGD, global batch 128
(64 per worker), on samples generated from a seed inside each worker. The systems:

  torchrun   `torchrun --nproc_per_node 2` running plain DDP in this same file
  ray_train  Ray Train's TorchTrainer (2 workers of 1 CPU), prepare_model/_data_loader
  raylight   raylight.fit with ctx.prepare_model / ctx.prepare_loader
  ray_actors the floor under any trainer built on Ray actors: Ray started as raylight's
             embedded cluster starts it (the quickest start found, docs/performance.md),
             a placement group, two bare actors of 1 CPU that form the gloo group
             (env://, as torchrun's workers) and run torchrun's worker code. No
             controller, checkpoints, pool or progress: raylight's start-to-first-step
             minus this row's is raylight's own cost; this row over torchrun's is what
             Ray's start and its worker processes cost on this machine
  raylight_core  the same, run by $RAYLIGHT_BENCH_CORE_PYTHON when set: an interpreter
             whose environment has raylight's core install only (`ray` without
             `[default]`, as `pip install raylight` gives), where Ray's dashboard
             processes start with fewer imports than under this venv's dev extras

Every run is its own child process, started cold (its own local Ray cluster for the
two Ray systems), and the systems are interleaved across repetitions. Rank 0 writes
wall-clock timestamps to a file; measured against the moment the parent launched the
child, they give, identically for all three:

  start_to_first_step_s  launch -> end of the first optimizer step (interpreter, Ray
                         and worker start-up included)
  wall_s                 launch -> end of the last step
  process_s              launch -> the child process has exited (shutdown included)
  steady_samples_per_s   global samples/s from the end of step 20 to the last step
  window_change          over the same steps, cut into 0.5 s windows: the mean relative
                         change of the mean step time from one window to the next, the
                         error of "the next window is as fast as the last" at a fixed plan
                         (what the adaptive benchmark's prediction error reads against)

raylight's child also times its start-up phase by phase (imports, Ray's start, placement
group, worker processes, loops' start and rendezvous, first step) and then runs WARM_FITS
more fits in the same driver, timing each from its call to its first step (warm workers);
then, per sharded strategy (FSDP; DeepSpeed where installed), a fit on new worker processes
(Ray already up: the DDP workers in the pool are not theirs) and one on the processes it
left (sharded_fit_start_s).

Results: a table on stdout and bench/results/overhead.json (medians, raw repetitions,
machine info, the ratios raylight/Ray Train start-up, raylight/torchrun start-up and
raylight/torchrun throughput against the goals <= 0.5, <= 1.2 and >= 0.95,
warm_fit_start_s against <= 0.5 s, and raylight_start_breakdown_s; ray_actors_vs_torchrun_start,
the bare Ray actors row over torchrun, and raylight_vs_ray_actors_start (raylight over that row);
with the core row, raylight_core_vs_torchrun_start and raylight_core_start_breakdown_s).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from common import (
    free_port,
    machine_info,
    median_of,
    ratio,
    run_child,
    run_once,
    run_ray_train,
    script_command,
    torchrun_command,
    write_results,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SYSTEMS = ("torchrun", "ray_train", "raylight", "ray_actors")
# raylight once more, run by an interpreter whose environment holds raylight's core install
# alone (`pip install raylight`: `ray` without `[default]`), as its users have it: this
# venv has the dev extras, whose `ray[default]` makes Ray start its dashboard processes with
# their full imports (docs/benchmarks.md). Unset: the row is left out and the JSON says why.
CORE_PYTHON_ENV = "RAYLIGHT_BENCH_CORE_PYTHON"
CORE = "raylight_core"
NUM_WORKERS = 2
SKIP_STEPS = 20  # steps left out of the steady-state throughput
PLACEMENT_GROUP_TIMEOUT_S = 60.0  # the ray_actors row's wait for its 2 CPUs
START_GOAL = 0.5  # raylight start-to-first-step <= this x Ray Train's
TORCHRUN_START_GOAL = 1.2  # ... and <= this x torchrun's
WARM_START_GOAL = 0.5  # a second fit in the same driver reaches its first step within this (s)
THROUGHPUT_GOAL = 0.95  # raylight steady samples/s >= this x torchrun's
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# -- the job, shared by the three systems ---------------------------------------------


def make_dataset(samples: int, seed: int) -> TensorDataset:
    """Gaussian inputs labelled by a fixed random linear teacher; the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 32, generator=gen)
    teacher = torch.randn(32, 10, generator=gen)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


class StepClock:
    """Rank 0's wall-clock timestamps of the optimizer steps."""

    def __init__(self, skip: int = SKIP_STEPS) -> None:
        self.skip = skip
        self.steps = 0
        self.first_step_end: float | None = None
        self.steady_start: float | None = None
        self.last_step_end: float | None = None
        self.steady_samples = 0
        self.steady_ends: list[float] = []  # every steady step's end

    def tick(self, global_samples: int) -> None:
        now = time.time()
        self.steps += 1
        if self.steps == 1:
            self.first_step_end = now
        if self.steps == self.skip:
            self.steady_start = now
        elif self.steps > self.skip:
            self.steady_samples += global_samples
        if self.steps >= self.skip:
            self.steady_ends.append(now)
        self.last_step_end = now

    def summary(self) -> dict[str, Any]:
        steady = None
        if self.steady_start is not None and self.last_step_end is not None:
            elapsed = self.last_step_end - self.steady_start
            steady = self.steady_samples / elapsed if elapsed > 0 else None
        return {
            "steps": self.steps,
            "first_step_end": self.first_step_end,
            "last_step_end": self.last_step_end,
            "steady_samples_per_s": steady,
            "window_change": window_change(self.steady_ends),
            "torch_threads": torch.get_num_threads(),
            "pid": os.getpid(),
        }


WINDOW_S = 0.5  # the adaptive benchmark's decision interval
MIN_WINDOW_STEPS = 5


def window_change(ends: list[float], window_s: float = WINDOW_S) -> float | None:
    """How much the mean step time moves from one window to the next: the mean over
    consecutive windows of |mean_k - mean_(k-1)| / mean_k, each mean over the steps that
    ended in a window of ``window_s`` (at least MIN_WINDOW_STEPS of them). The error a
    prediction "the next window is as fast as the last" makes, at a fixed plan: the
    adaptive benchmark's step_time_prediction_error reads against it."""
    means = []
    start, durations = None, []
    for prev, end in itertools.pairwise(ends):
        if start is None or end - start >= window_s:
            if start is not None:
                means.append(sum(durations) / len(durations) if len(durations) >= MIN_WINDOW_STEPS else None)
            start, durations = end, []
        durations.append(end - prev)
    pairs = [(a, b) for a, b in itertools.pairwise(means) if a is not None and b is not None]
    return statistics.fmean(abs(b - a) / b for a, b in pairs) if pairs else None


def train(
    model: nn.Module,
    loader: Iterable,
    set_epoch: Callable[[int], None],
    job: dict[str, Any],
    rank: int,
    world_size: int,
    prepare: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None,
) -> None:
    """The training loop every system runs; rank 0 writes its timings to the result file.
    ``prepare``: raylight's ``ctx.prepare_optimizer``, for the strategies that need it."""
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=0.9)
    opt = prepare(opt) if prepare is not None else opt
    loss_fn = nn.CrossEntropyLoss()
    clock = StepClock()
    for epoch in range(job["epochs"]):
        set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if rank == 0:
                clock.tick(len(y) * world_size)
    if rank == 0:
        Path(job["result_path"]).write_text(json.dumps(clock.summary()))


# -- the three systems' worker code ---------------------------------------------------


def torchrun_worker(job: dict[str, Any]) -> None:
    """One torchrun process: plain DDP with a DistributedSampler."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset(job["samples"], job["seed"])
    sampler = DistributedSampler(dataset, shuffle=True, seed=job["seed"])
    loader = DataLoader(dataset, batch_size=job["batch_size"] // world_size, sampler=sampler)
    model = DistributedDataParallel(make_model(job["seed"]))
    train(model, loader, sampler.set_epoch, job, rank, world_size)
    dist.destroy_process_group()


def ray_train_loop(job: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker."""
    import ray.train
    import ray.train.torch

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    world_size = ctx.get_world_size()
    dataset = make_dataset(job["samples"], job["seed"])
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(dataset, batch_size=job["batch_size"] // world_size, shuffle=True)
    )
    model = ray.train.torch.prepare_model(make_model(job["seed"]))
    train(model, loader, loader.sampler.set_epoch, job, ctx.get_world_rank(), world_size)


def raylight_loop(ctx: Any, job: dict[str, Any]) -> None:
    """raylight's train loop; its batch_size is the global batch."""
    if ctx.rank == 0:  # the process group is formed: the breakdown's "rendezvous" ends here
        Path(job["result_path"] + ".loop").write_text(str(time.time()))
    torch.set_num_threads(1)
    dataset = make_dataset(job["samples"], job["seed"])
    loader = ctx.prepare_loader(
        dataset, batch_size=job["batch_size"], shuffle=True, seed=job["seed"]
    )
    model = ctx.prepare_model(make_model(job["seed"]))
    prepare = ctx.prepare_optimizer if job.get("strategy") else None  # DDP runs as it always did
    train(model, loader, loader.set_epoch, job, ctx.rank, ctx.world_size, prepare)


# -- child processes: one run of one system -------------------------------------------


def child_ray_train(job: dict[str, Any]) -> None:
    run_ray_train(ray_train_loop, job, NUM_WORKERS)


WARM_FITS = 2  # further fits in the same driver, each timed to its first step
WARM_SAMPLES = 6_400  # they train on this many samples (their first step is what counts)
SHARDED = ("fsdp", "deepspeed")  # each: a fit on new processes, then one on the same processes


def _timed_phases(marks: dict[str, float]) -> None:
    """Record when the worker group first finishes each start-up phase (wall clock)."""
    from raylight.worker_group.ray_group import RayWorkerGroup

    for method, mark in (("_reserve", "placement_group_s"), ("_spawn", "workers_started_s"), ("_launch", "loops_started_s")):
        original = getattr(RayWorkerGroup, method)

        def timed(self: Any, *args: Any, _original: Any = original, _mark: str = mark, **kwargs: Any) -> Any:
            out = _original(self, *args, **kwargs)
            marks.setdefault(_mark, time.time())
            return out

        setattr(RayWorkerGroup, method, timed)


def child_raylight(job: dict[str, Any]) -> None:
    marks: dict[str, float] = {}
    import ray

    import raylight
    from raylight.driver import runtime

    marks["imports_s"] = time.time()
    _timed_phases(marks)
    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    marks["ray_started_s"] = time.time()
    warm: list[float] = []
    sharded: dict[str, dict[str, float]] = {}

    def fit_start(name: str, **kwargs: Any) -> float:
        """A short fit in this driver: seconds from its call to its first step."""
        again = {**job, "samples": WARM_SAMPLES, "epochs": 1, "result_path": f"{job['result_path']}.{name}", **kwargs}
        called = time.time()
        raylight.fit(
            raylight_loop, config=again, num_workers=NUM_WORKERS, progress=False,
            storage_path=job["storage_path"], name=f"bench-{name}", strategy=kwargs.get("strategy", "ddp"),
        )
        return float(json.loads(Path(again["result_path"]).read_text())["first_step_end"] - called)

    try:
        raylight.fit(
            raylight_loop,
            config=job,
            num_workers=NUM_WORKERS,
            progress=False,
            storage_path=job["storage_path"],
            name="bench",
        )
        for i in range(WARM_FITS):  # the notebook user's next fit: workers come from the pool
            warm.append(fit_start(f"warm{i}"))
        for strategy in SHARDED:
            if strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
                continue
            sharded[strategy] = {kind: fit_start(f"{strategy}-{kind}", strategy=strategy) for kind in ("new", "warm")}
    finally:
        ray.shutdown()
    result = Path(job["result_path"])
    summary = json.loads(result.read_text())
    marks["rendezvous_s"] = float(Path(f"{job['result_path']}.loop").read_text())
    summary["phases"] = marks  # wall clock; read_result makes them relative to the launch
    summary["warm_fit_start_s"] = statistics.median(warm) if warm else None
    summary["sharded_fit_start_s"] = sharded
    result.write_text(json.dumps(summary))


def child_ray_actors(job: dict[str, Any]) -> None:
    """torchrun's worker code on two bare Ray actors (the module docstring's ray_actors)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from raylight.driver import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    try:
        group = placement_group([{"CPU": 1}] * NUM_WORKERS, strategy="PACK")
        try:
            ray.get(group.ready(), timeout=PLACEMENT_GROUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the placement group of {NUM_WORKERS} CPUs was not ready after {PLACEMENT_GROUP_TIMEOUT_S:g} s "
                "(bench/overhead.py PLACEMENT_GROUP_TIMEOUT_S); is another Ray job holding this machine's CPUs?"
            ) from None
        port = free_port()

        @ray.remote(num_cpus=1)
        class Rank:
            def run(self, rank: int) -> None:
                os.environ.update(
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                    LOCAL_RANK=str(rank), WORLD_SIZE=str(NUM_WORKERS),
                )
                torchrun_worker(job)

        ranks = [
            Rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
            for i in range(NUM_WORKERS)
        ]
        ray.get([r.run.remote(i) for i, r in enumerate(ranks)])  # bounded by the parent's --timeout, which kills this child
    finally:
        ray.shutdown()


CHILDREN = {
    "torchrun-worker": torchrun_worker,
    "ray_train": child_ray_train,
    "raylight": child_raylight,
    "ray_actors": child_ray_actors,
}


# -- the parent: launch, time (common.run_once) --------------------------------------


def child_command(system: str, job: dict[str, Any]) -> list[str]:
    this_file = str(Path(__file__).resolve())
    if system == "torchrun":
        return [*torchrun_command(NUM_WORKERS, job["run_dir"]), this_file, "--child", "torchrun-worker", "--job", json.dumps(job)]
    if system == CORE:
        return [os.environ[CORE_PYTHON_ENV], *script_command(this_file, "raylight", job)[1:]]
    return script_command(this_file, system, job)


def systems() -> tuple[str, ...]:
    """The systems this run measures: SYSTEMS, and raylight's core install where given."""
    return (*SYSTEMS, CORE) if os.environ.get(CORE_PYTHON_ENV) else SYSTEMS


# -- summary --------------------------------------------------------------------------

METRICS = ("start_to_first_step_s", "wall_s", "process_s", "steady_samples_per_s", "window_change", "warm_fit_start_s")
# raylight's start-up, phase by phase (seconds from the launch to the end of each): the
# interpreter and imports, Ray's start, the placement group, the worker processes (start,
# import torch and raylight), the rendezvous and the loops' start, the first step.
PHASES = ("imports_s", "ray_started_s", "placement_group_s", "workers_started_s", "loops_started_s", "rendezvous_s")


def medians(reps: list[dict[str, Any]]) -> dict[str, float | None]:
    return {metric: median_of(reps, metric) for metric in METRICS}


def start_breakdown(reps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median seconds spent in each start-up phase (each from the end of the one before)."""
    ok = [r for r in reps if r["ok"] and r.get("phases")]
    spans: dict[str, list[float]] = {}
    for rep in ok:
        marks = rep["phases"]
        previous = 0.0
        for phase in (*PHASES, "first_step_s"):
            end = rep["start_to_first_step_s"] if phase == "first_step_s" else marks.get(phase)
            if end is None:
                continue
            spans.setdefault(phase, []).append(end - previous)
            previous = end
    return {phase: statistics.median(v) for phase, v in spans.items()}


def sharded_starts(reps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median seconds to the first step of a sharded fit on new and on reused processes."""
    values: dict[tuple[str, str], list[float]] = {}
    for rep in (r for r in reps if r["ok"]):
        for strategy, kinds in rep.get("sharded_fit_start_s", {}).items():
            for kind, seconds in kinds.items():
                values.setdefault((strategy, kind), []).append(seconds)
    out: dict[str, dict[str, float]] = {}
    for (strategy, kind), v in values.items():
        out.setdefault(strategy, {})[kind] = statistics.median(v)
    return out


def goals(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    med = {name: s["median"] for name, s in summary.items()}
    start = ratio(
        med["raylight"]["start_to_first_step_s"], med["ray_train"]["start_to_first_step_s"]
    )
    throughput = ratio(
        med["raylight"]["steady_samples_per_s"], med["torchrun"]["steady_samples_per_s"]
    )
    vs_torchrun = ratio(
        med["raylight"]["start_to_first_step_s"], med["torchrun"]["start_to_first_step_s"]
    )
    warm = med["raylight"]["warm_fit_start_s"]
    floor = ratio(med["ray_actors"]["start_to_first_step_s"], med["torchrun"]["start_to_first_step_s"])
    core: dict[str, Any] = (
        {
            "raylight_core_vs_torchrun_start": ratio(
                med[CORE]["start_to_first_step_s"], med["torchrun"]["start_to_first_step_s"]
            ),
            "raylight_core_start_breakdown_s": start_breakdown(summary[CORE]["reps"]),
        }
        if CORE in summary
        else {
            "raylight_core_vs_torchrun_start": None,
            "raylight_core_start_breakdown_s": None,
            "raylight_core_missing": f"{CORE_PYTHON_ENV} is not set (docs/benchmarks.md: a venv with raylight's core install)",
        }
    )
    return {
        "raylight_vs_ray_train_start": start,
        "raylight_vs_torchrun_start": vs_torchrun,
        "raylight_vs_torchrun_throughput": throughput,
        "ray_actors_vs_torchrun_start": floor,
        "raylight_vs_ray_actors_start": ratio(
            med["raylight"]["start_to_first_step_s"], med["ray_actors"]["start_to_first_step_s"]
        ),
        "warm_fit_start_s": warm,
        "start_goal_met": None if start is None else start <= START_GOAL,
        "torchrun_start_goal_met": None if vs_torchrun is None else vs_torchrun <= TORCHRUN_START_GOAL,
        "warm_start_goal_met": None if warm is None else warm <= WARM_START_GOAL,
        "throughput_goal_met": None if throughput is None else throughput >= THROUGHPUT_GOAL,
        "raylight_start_breakdown_s": start_breakdown(summary["raylight"]["reps"]),
        "sharded_fit_start_s": sharded_starts(summary["raylight"]["reps"]),
        **core,
    }


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(summary: dict[str, dict[str, Any]], verdict: dict[str, Any]) -> None:
    print(
        f"\n{'system':<13} {'ok':>5} {'start->1st step s':>18} {'wall s':>8} "
        f"{'process s':>10} {'steady samples/s':>17} {'window change':>14}"
    )
    for name, s in summary.items():
        m = s["median"]
        status = f"{s['ok_reps']}/{len(s['reps'])}"
        print(
            f"{name:<13} {status:>5} {fmt(m['start_to_first_step_s'], '.2f'):>18} "
            f"{fmt(m['wall_s'], '.2f'):>8} {fmt(m['process_s'], '.2f'):>10} "
            f"{fmt(m['steady_samples_per_s'], ',.0f'):>17} {fmt(m['window_change'], '.3f'):>14}"
        )
    print(
        f"(medians over successful repetitions; window change: the mean relative change of "
        f"the mean step time from one {WINDOW_S} s window to the next)"
    )
    for name, s in summary.items():
        for rep in s["reps"]:
            if not rep["ok"]:
                print(f"  {name} FAILED: {rep['error']}\n    " + rep["stderr_tail"][-600:])
    start, tput = verdict["raylight_vs_ray_train_start"], verdict["raylight_vs_torchrun_throughput"]
    print(
        f"raylight / Ray Train start-to-first-step: {fmt(start, '.3f')} "
        f"(goal <= {START_GOAL}: {verdict['start_goal_met']})"
    )
    print(
        f"raylight / torchrun steady throughput:    {fmt(tput, '.3f')} "
        f"(goal >= {THROUGHPUT_GOAL}: {verdict['throughput_goal_met']})"
    )
    print(
        f"raylight / torchrun start-to-first-step:  {fmt(verdict['raylight_vs_torchrun_start'], '.3f')} "
        f"(goal <= {TORCHRUN_START_GOAL}: {verdict['torchrun_start_goal_met']})"
    )
    print(
        f"bare Ray actors / torchrun start-to-first-step: {fmt(verdict['ray_actors_vs_torchrun_start'], '.3f')} "
        f"(Ray's floor here); raylight / bare Ray actors: {fmt(verdict['raylight_vs_ray_actors_start'], '.3f')}"
    )
    print(
        f"raylight warm fit start-to-first-step:    {fmt(verdict['warm_fit_start_s'], '.3f')} s "
        f"(goal <= {WARM_START_GOAL} s: {verdict['warm_start_goal_met']})"
    )
    print("raylight cold start, s per phase: " + per_phase(verdict["raylight_start_breakdown_s"]))
    for strategy, kinds in verdict["sharded_fit_start_s"].items():
        print(
            f"raylight {strategy} fit start-to-first-step, Ray running: new processes "
            f"{fmt(kinds.get('new'), '.2f')} s, reused {fmt(kinds.get('warm'), '.3f')} s"
        )
    if verdict["raylight_core_start_breakdown_s"] is not None:
        print(
            f"raylight (core install) / torchrun start-to-first-step: {fmt(verdict['raylight_core_vs_torchrun_start'], '.3f')}; "
            "s per phase: " + per_phase(verdict["raylight_core_start_breakdown_s"])
        )


def per_phase(breakdown: dict[str, float | None]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} {fmt(v, '.2f')}" for k, v in breakdown.items())


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    job = {"samples": args.samples, "epochs": args.epochs, "batch_size": 128, "lr": 0.05, "seed": 0}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in systems()}
    for rep in range(args.reps):
        for name in reps:  # interleaved, so drift hits every system alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            record = run_once(name, job, args.timeout, command=child_command)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    summary = {
        name: {"median": medians(r), "ok_reps": sum(x["ok"] for x in r), "reps": r}
        for name, r in reps.items()
    }
    return {
        "config": {
            **job,
            "num_workers": NUM_WORKERS,
            "reps": args.reps,
            "skip_steps": SKIP_STEPS,
            "timeout_s": args.timeout,
            "model": "MLP 32-256-256-10 float32",
            "backend": "gloo (CPU)",
            "torch_threads_per_worker": 1,
        },
        "machine": machine_info(),
        "systems": summary,
        **goals(summary),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run, 1 repetition")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default bench/results/overhead.json, overhead-quick.json with --quick)",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.samples, args.epochs = 1, 6_400, 1
    if args.out is None:
        args.out = RESULTS_DIR / ("overhead-quick.json" if args.quick else "overhead.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if run_child(args, CHILDREN):
        return
    results = run_benchmark(args)
    print_table(results["systems"], results)
    write_results(args.out, results)


if __name__ == "__main__":
    main()

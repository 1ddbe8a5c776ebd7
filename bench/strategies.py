"""Sharded training: memory, throughput and checkpoint time of DDP, FSDP and DeepSpeed ZeRO-3,
under raylight and its peers, side by side.

The same job under each system: an MLP of ``--layers`` square blocks of ``--width`` (about
50 M parameters by default, fp32), Adam, global batch 32 on 2 workers, gloo, 1 torch thread
per worker, ``--steps`` steps. Systems, interleaved over ``--reps`` repetitions, each a cold
child process:

  raylight_ddp     raylight.fit(strategy="ddp")
  raylight_fsdp    raylight.fit(strategy=FSDP(blocks=("Block",))), the model built on meta
  torchrun_fsdp    torchrun running plain FSDP2 the way torch's docs show it (meta device,
                   fully_shard per block then the root, to_empty, reset_parameters)
  raylight_zero3   raylight.fit(strategy=DeepSpeed(stage=3))
  torchrun_zero3   torchrun running deepspeed.initialize with the same DeepSpeed config
  ray_train_zero3  Ray Train's TorchTrainer running the same DeepSpeed loop

Per worker (the figures take the larger worker):
  peak_delta    peak resident memory of the worker process minus its resident memory before
                the model was built: parameters, gradients and optimizer state, plus
                activations, communication buffers and the allocator's slack
  rss_delta     resident memory after the last step minus the same baseline
  state_bytes   DDP and FSDP only: bytes of the parameter, gradient and optimizer-state
                tensors this worker holds (a sharded tensor counts its local shard)
Rank 0 also times the steady steps (samples/s, after SKIP_STEPS), one checkpoint of model
and optimizer until it is committed (raylight: ``ctx.report(checkpoint={"model": model,
"opt": opt})`` until the driver has written ``meta.json``, sharded for FSDP and ZeRO-3;
torchrun: ``torch.distributed.checkpoint.save``, or DeepSpeed's ``save_checkpoint``) and
loading it back into a fresh model and optimizer (raylight: ``ctx.load_checkpoint`` in a
resumed run; torchrun: ``dcp.load``, or DeepSpeed's ``load_checkpoint``). Ray Train is
timed on steps and memory only.

Results: a table on stdout and bench/results/strategies.json with the figures
fsdp_memory_vs_ddp and zero3_memory_vs_ddp (peak_delta; goal <= 0.6 with 2 workers),
fsdp_throughput_vs_ddp, deepspeed_throughput_vs_ray_train_deepspeed (goal >= 1.0),
raylight_fsdp_vs_torchrun_fsdp_throughput and raylight_zero3_vs_torchrun_zero3_throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import (
    ChildRun,
    machine_info,
    median_of,
    ratio,
    run_child,
    run_ray_train,
    script_command,
    torchrun_command,
    write_results,
)
from torch import nn

SYSTEMS = ("raylight_ddp", "raylight_fsdp", "torchrun_fsdp", "raylight_zero3", "torchrun_zero3", "ray_train_zero3")
NUM_WORKERS = 2
SKIP_STEPS = 3
MEMORY_GOAL = 0.6  # a sharded strategy's peak memory per worker <= this x DDP's
THROUGHPUT_GOAL = 1.0  # raylight's DeepSpeed >= this x Ray Train's
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


def make_model(job: dict[str, Any], device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    w = job["width"]
    with torch.device(device):
        return nn.Sequential(*(Block(w) for _ in range(job["layers"])), nn.Linear(w, 10))


def deepspeed_config(job: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config every ZeRO-3 system runs (raylight is given it without the batch
    fields, which it fills itself). ZeRO-3's defaults keep up to 1e9 parameters gathered and
    prefetch 5e7 elements ahead, i.e. this whole model: it would never be partitioned in
    memory. A user who shards to save memory bounds both, here to two blocks."""
    block = job["width"] * job["width"]
    return {
        "train_micro_batch_size_per_gpu": job["batch_size"] // NUM_WORKERS,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "stage3_max_live_parameters": 2 * block,
            "stage3_max_reuse_distance": 2 * block,
            "stage3_prefetch_bucket_size": block,
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def local_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def state_bytes(model: nn.Module, opt: Any) -> int | None:
    if not isinstance(opt, torch.optim.Optimizer) or getattr(opt, "_raylight_deepspeed", False):
        return None
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return local_bytes(params) + local_bytes(grads) + local_bytes(states)


def train_steps(step: Any, job: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The loop every system runs: random inputs (the same on every run), MSE to zero.
    ``step(x)`` runs one optimizer step on this rank's micro-batch."""
    gen = torch.Generator().manual_seed(rank)
    local = job["batch_size"] // world
    times = []
    for _ in range(job["steps"]):
        x = torch.randn(local, job["width"], generator=gen)
        start = time.perf_counter()
        step(x)
        times.append(time.perf_counter() - start)
    steady = times[SKIP_STEPS:]
    return {"steady_samples_per_s": job["batch_size"] * len(steady) / sum(steady), "step_s": statistics.median(steady)}


def torch_step(model: nn.Module, opt: Any) -> Any:
    def step(x: torch.Tensor) -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    return step


def memory(record: dict[str, Any], base: int) -> dict[str, Any]:
    record.update(
        rss_delta=rss_bytes() - base,
        peak_delta=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base,
    )
    return record


def write_worker(job: dict[str, Any], record: dict[str, Any], phase: str = "train") -> None:
    Path(f"{job['result_path']}.{phase}.{record['rank']}").write_text(json.dumps(record))


def wait_for(path: Path, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g}s")
        time.sleep(0.01)


# -- raylight ---------------------------------------------------------------------------


def raylight_loop(ctx: Any, job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    base = rss_bytes()
    sharded = job["system"] != "raylight_ddp"
    model = ctx.prepare_model(make_model(job, "meta" if sharded else "cpu"))
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-4))
    if job["phase"] == "load":  # a resumed run: time loading the committed checkpoint
        start = time.perf_counter()
        ctx.load_checkpoint({"model": model, "opt": opt})
        write_worker(job, {"rank": ctx.rank, "checkpoint_load_s": time.perf_counter() - start}, "load")
        return
    record = train_steps(torch_step(model, opt), job, ctx.rank, ctx.world_size)
    record["state_bytes"] = state_bytes(ctx.unwrap_model(model), opt)
    record = memory(dict(record, rank=ctx.rank), base)
    start = time.perf_counter()
    ctx.report({}, checkpoint={"model": model, "opt": opt})
    if ctx.rank == 0:  # committed when the driver has written meta.json
        wait_for(Path(job["storage_path"], "bench", "checkpoints", "checkpoint_000000", "meta.json"))
    record["checkpoint_save_s"] = time.perf_counter() - start
    write_worker(job, record)


def child_raylight(job: dict[str, Any]) -> None:
    import ray

    import raylight
    from raylight.driver import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    strategy: Any = {
        "raylight_ddp": "ddp",
        "raylight_fsdp": raylight.FSDP(blocks=("Block",)),
        "raylight_zero3": getattr(raylight, "DeepSpeed", None) and raylight.DeepSpeed(
            stage=3, config={k: v for k, v in deepspeed_config(job).items() if "batch" not in k and "accumulation" not in k},
        ),
    }[job["system"]]
    try:
        for phase, resume in (("train", False), ("load", True)):
            raylight.fit(
                raylight_loop, config=dict(job, phase=phase), num_workers=NUM_WORKERS, strategy=strategy,
                progress=False, storage_path=job["storage_path"], name="bench", resume=resume,
            )
    finally:
        ray.shutdown()


# -- torchrun -----------------------------------------------------------------------------


def torchrun_fsdp_worker(job: dict[str, Any]) -> None:
    """One torchrun process: FSDP2 by hand, the way its docs show it, checkpointed with DCP."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = make_model(job, "meta")
        for module in model:
            if isinstance(module, Block):
                fully_shard(module)
        fully_shard(model)
        model.to_empty(device="cpu")
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        return model, torch.optim.Adam(model.parameters(), lr=1e-4)

    base = rss_bytes()
    model, opt = build()
    record = train_steps(torch_step(model, opt), job, rank, world)
    record["state_bytes"] = state_bytes(model, opt)
    record = memory(dict(record, rank=rank), base)
    path = str(Path(job["storage_path"], "dcp"))
    start = time.perf_counter()
    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "opt": opt_state}, checkpoint_id=path)
    record["checkpoint_save_s"] = time.perf_counter() - start
    model, opt = build()
    start = time.perf_counter()
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "opt": opt_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
    record["checkpoint_load_s"] = time.perf_counter() - start
    write_worker(job, record)
    finish_torchrun()


def finish_torchrun() -> None:
    """Leave the process group together: a rank tearing gloo down while the other still
    uses it aborted the process ("terminate called without an active exception") in
    about one run in five, after its results were written."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def deepspeed_engine(job: dict[str, Any]) -> tuple[Any, Any]:
    import deepspeed

    model = make_model(job)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=deepspeed_config(job))
    return engine, optimizer


def deepspeed_step(engine: Any) -> Any:
    def step(x: torch.Tensor) -> None:
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()

    return step


def torchrun_zero3_worker(job: dict[str, Any]) -> None:
    """One torchrun process: DeepSpeed ZeRO-3 as its docs show it, with its own checkpoints."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    base = rss_bytes()
    engine, _ = deepspeed_engine(job)
    record = train_steps(deepspeed_step(engine), job, rank, world)
    record = memory(dict(record, rank=rank, state_bytes=None), base)
    path = str(Path(job["storage_path"], "deepspeed"))
    start = time.perf_counter()
    engine.save_checkpoint(path)
    record["checkpoint_save_s"] = time.perf_counter() - start
    engine, _ = deepspeed_engine(job)
    start = time.perf_counter()
    engine.load_checkpoint(path)
    record["checkpoint_load_s"] = time.perf_counter() - start
    write_worker(job, record)
    finish_torchrun()


def ray_train_zero3_loop(job: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker: the same DeepSpeed engine and steps."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import ray.train

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    base = rss_bytes()
    engine, _ = deepspeed_engine(job)
    record = train_steps(deepspeed_step(engine), job, ctx.get_world_rank(), ctx.get_world_size())
    write_worker(job, memory(dict(record, rank=ctx.get_world_rank(), state_bytes=None), base))


def child_ray_train(job: dict[str, Any]) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # inherited by the Ray workers
    run_ray_train(ray_train_zero3_loop, job, NUM_WORKERS)


CHILDREN = {
    "raylight": child_raylight,
    "ray-train": child_ray_train,
    "torchrun-fsdp": torchrun_fsdp_worker,
    "torchrun-zero3": torchrun_zero3_worker,
}


def child_command(system: str, job: dict[str, Any]) -> list[str]:
    this_file = str(Path(__file__).resolve())
    if system.startswith("torchrun"):
        return [*torchrun_command(NUM_WORKERS, job["run_dir"]), this_file, "--child", system.replace("_", "-"), "--job", json.dumps(job)]
    return script_command(this_file, "ray-train" if system == "ray_train_zero3" else "raylight", job)


# -- the parent ---------------------------------------------------------------------------


def run_once(system: str, base_job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    run = ChildRun(dict(base_job, system=system), prefix="rls-")
    record: dict[str, Any] = {"system": system, "ok": False}
    env = {"DS_ACCELERATOR": "cpu"} if "zero3" in system else {}
    os.environ.update(env)  # the child and its Ray workers inherit it
    try:
        run.launch(child_command(system, run.job), timeout_s)
    finally:
        for key in env:
            os.environ.pop(key, None)
    record["process_s"] = run.process_s
    record["leftover_pids"] = run.reap()
    if run.error is not None:
        record["error"] = run.error
        return run.finish(record)
    workers = []
    for rank in range(NUM_WORKERS):
        path = Path(f"{run.job['result_path']}.train.{rank}")
        if not path.exists():
            record["error"] = f"worker {rank} wrote no result"
            return run.finish(record)
        worker = json.loads(path.read_text())
        loaded = Path(f"{run.job['result_path']}.load.{rank}")
        if loaded.exists():
            worker.update(json.loads(loaded.read_text()))
        workers.append(worker)
    record["workers"] = workers
    for key in ("state_bytes", "rss_delta", "peak_delta"):
        values = [w[key] for w in workers if w.get(key) is not None]
        record[key] = max(values) if values else None
    zero = next(w for w in workers if w["rank"] == 0)
    for key in ("steady_samples_per_s", "step_s", "checkpoint_save_s", "checkpoint_load_s"):
        record[key] = zero.get(key)
    return run.finish(record)


METRICS = (
    "peak_delta", "rss_delta", "state_bytes", "steady_samples_per_s", "checkpoint_save_s", "checkpoint_load_s",
    "process_s",
)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    job = {"width": args.width, "layers": args.layers, "steps": args.steps, "batch_size": 32}
    systems = [s for s in SYSTEMS if s in args.systems]
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for rep in range(args.reps):
        for name in systems:  # interleaved, so drift hits every system alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            record = run_once(name, job, args.timeout)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    med = {name: {m: median_of(rs, m) for m in METRICS} for name, rs in reps.items()}
    empty = dict.fromkeys(METRICS)

    def get(system: str, metric: str) -> float | None:
        return med.get(system, empty)[metric]

    tput = "steady_samples_per_s"
    figures = {
        "fsdp_memory_vs_ddp": ratio(get("raylight_fsdp", "peak_delta"), get("raylight_ddp", "peak_delta")),
        "zero3_memory_vs_ddp": ratio(get("raylight_zero3", "peak_delta"), get("raylight_ddp", "peak_delta")),
        "fsdp_state_vs_ddp": ratio(get("raylight_fsdp", "state_bytes"), get("raylight_ddp", "state_bytes")),
        "fsdp_rss_after_vs_ddp": ratio(get("raylight_fsdp", "rss_delta"), get("raylight_ddp", "rss_delta")),
        "fsdp_throughput_vs_ddp": ratio(get("raylight_fsdp", tput), get("raylight_ddp", tput)),
        "zero3_throughput_vs_ddp": ratio(get("raylight_zero3", tput), get("raylight_ddp", tput)),
        "deepspeed_throughput_vs_ray_train_deepspeed": ratio(get("raylight_zero3", tput), get("ray_train_zero3", tput)),
        "raylight_fsdp_vs_torchrun_fsdp_throughput": ratio(get("raylight_fsdp", tput), get("torchrun_fsdp", tput)),
        "raylight_zero3_vs_torchrun_zero3_throughput": ratio(get("raylight_zero3", tput), get("torchrun_zero3", tput)),
        "raylight_fsdp_vs_torchrun_fsdp_memory": ratio(get("raylight_fsdp", "peak_delta"), get("torchrun_fsdp", "peak_delta")),
        "raylight_zero3_vs_torchrun_zero3_memory": ratio(get("raylight_zero3", "peak_delta"), get("torchrun_zero3", "peak_delta")),
    }

    def goal(value: float | None, text: str, ok: bool) -> dict[str, Any]:
        return {"goal": text, "value": value, "met": value is not None and ok}

    mem_f, mem_z = figures["fsdp_memory_vs_ddp"], figures["zero3_memory_vs_ddp"]
    vs_rt = figures["deepspeed_throughput_vs_ray_train_deepspeed"]
    params = sum(p.numel() for p in make_model(job, "meta").parameters())
    return {
        "config": {
            **job, "parameters": params, "num_workers": NUM_WORKERS, "reps": args.reps, "systems": systems,
            "skip_steps": SKIP_STEPS, "optimizer": "Adam", "dtype": "float32", "backend": "gloo (CPU)",
            "torch_threads_per_worker": 1, "deepspeed_config": deepspeed_config(job),
        },
        "machine": machine_info(),
        "medians": med,
        "reps": reps,
        "figures": figures,
        "goals": {
            "fsdp_memory_vs_ddp": goal(mem_f, f"<= {MEMORY_GOAL}", mem_f is not None and mem_f <= MEMORY_GOAL),
            "zero3_memory_vs_ddp": goal(mem_z, f"<= {MEMORY_GOAL}", mem_z is not None and mem_z <= MEMORY_GOAL),
            "deepspeed_throughput_vs_ray_train_deepspeed": goal(
                vs_rt, f">= {THROUGHPUT_GOAL}", vs_rt is not None and vs_rt >= THROUGHPUT_GOAL
            ),
        },
    }


def print_table(results: dict[str, Any]) -> None:
    mib = 1024 * 1024

    def fmt(value: float | None, scale: float = 1.0, spec: str = ".0f") -> str:
        return "-" if value is None else format(value / scale, spec)

    print(f"\n{results['config']['parameters'] / 1e6:.1f} M parameters, {NUM_WORKERS} workers (medians; memory: the larger worker)")
    print(
        f"{'system':<16} {'peak MiB':>9} {'after MiB':>10} {'state MiB':>10} {'samples/s':>10} "
        f"{'ckpt save s':>12} {'ckpt load s':>12}"
    )
    for name, m in results["medians"].items():
        if m["steady_samples_per_s"] is None:
            print(f"{name:<16} failed")
            continue
        print(
            f"{name:<16} {fmt(m['peak_delta'], mib):>9} {fmt(m['rss_delta'], mib):>10} {fmt(m['state_bytes'], mib):>10} "
            f"{fmt(m['steady_samples_per_s'], 1, '.1f'):>10} {fmt(m['checkpoint_save_s'], 1, '.2f'):>12} "
            f"{fmt(m['checkpoint_load_s'], 1, '.2f'):>12}"
        )
    for key, value in results["figures"].items():
        print(f"{key:<46} {fmt(value, 1, '.3f')}")
    for key, g in results["goals"].items():
        print(f"{key} goal {g['goal']}: {'met' if g['met'] else 'NOT met'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child run")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run, 1 repetition")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/strategies.json)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.width, args.layers, args.steps = 1, 256, 4, 6
    if args.out is None:
        args.out = RESULTS_DIR / ("strategies-quick.json" if args.quick else "strategies.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if run_child(args, CHILDREN):
        return
    results = run_benchmark(args)
    print_table(results)
    write_results(args.out, results)


if __name__ == "__main__":
    main()

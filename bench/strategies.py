"""Sharded training: memory, throughput and checkpoint time of DDP and FSDP, side by side.

The same job under each system: an MLP of ``--layers`` square blocks of ``--width`` (about
50 M parameters by default, fp32), Adam, global batch 32 on 2 workers, gloo, 1 torch thread
per worker, ``--steps`` steps. Systems, interleaved over ``--reps`` repetitions, each a cold
child process:

  raylight_ddp    raylight.fit(strategy="ddp")
  raylight_fsdp   raylight.fit(strategy=FSDP(blocks=("Block",)))
  torchrun_fsdp   torchrun running plain FSDP2 (fully_shard per block, then the root)

Per worker, after the last step and before any checkpoint:
  state_bytes   bytes of the tensors this worker holds for parameters, gradients and
                optimizer state (a sharded tensor counts its local shard): the memory
                sharding is meant to divide
  rss_delta     resident memory now minus before the model was built (adds activations,
                communication buffers, the allocator's slack)
Rank 0 also times the steady steps (samples/s, after SKIP_STEPS) and one checkpoint of
model and optimizer: raylight's ``ctx.report(checkpoint=...)`` (gather + serialise);
torchrun's full-state-dict gather plus ``torch.save`` to a file.

Results: a table on stdout and bench/results/strategies.json with the ratios
fsdp_memory_vs_ddp (goal <= 0.6 with 2 workers), fsdp_throughput_vs_ddp and
raylight_fsdp_vs_torchrun_fsdp_throughput. DeepSpeed is not measured: raylight has no
DeepSpeed strategy yet.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import ChildRun, free_port, machine_info, run_child, script_command, write_results
from torch import nn

SYSTEMS = ("raylight_ddp", "raylight_fsdp", "torchrun_fsdp")
NUM_WORKERS = 2
SKIP_STEPS = 3
MEMORY_GOAL = 0.6  # FSDP's state bytes per worker <= this x DDP's
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


def make_model(job: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    w = job["width"]
    return nn.Sequential(*(Block(w) for _ in range(job["layers"])), nn.Linear(w, 10))


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


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return local_bytes(params) + local_bytes(grads) + local_bytes(states)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, job: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The loop every system runs: random inputs (the same on every run), MSE to zero."""
    gen = torch.Generator().manual_seed(rank)
    local = job["batch_size"] // world
    times = []
    for _ in range(job["steps"]):
        x = torch.randn(local, job["width"], generator=gen)
        start = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    steady = times[SKIP_STEPS:]
    return {"steady_samples_per_s": job["batch_size"] * len(steady) / sum(steady), "step_s": statistics.median(steady)}


def measured(model: nn.Module, opt: torch.optim.Optimizer, job: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    base = job.pop("_rss_base")
    out = train_steps(model, opt, job, rank, world)
    out.update(
        rank=rank,
        state_bytes=state_bytes(model, opt),
        rss_delta=rss_bytes() - base,
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )
    return out


def write_worker(job: dict[str, Any], record: dict[str, Any]) -> None:
    Path(job["result_path"] + f".{record['rank']}").write_text(json.dumps(record))


# -- the systems' worker code -------------------------------------------------------------


def raylight_loop(ctx: Any, job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    job = dict(job, _rss_base=rss_bytes())
    model = ctx.prepare_model(make_model(job))
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=1e-4))
    record = measured(model, opt, job, ctx.rank, ctx.world_size)
    start = time.perf_counter()
    ctx.report({}, checkpoint={"model": ctx.unwrap_model(model).state_dict(), "opt": opt.state_dict()})
    record["checkpoint_save_s"] = time.perf_counter() - start
    write_worker(job, record)


def child_raylight(job: dict[str, Any]) -> None:
    import ray

    import raylight
    from raylight import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    strategy: Any = "ddp" if job["system"] == "raylight_ddp" else raylight.FSDP(blocks=("Block",))
    try:
        raylight.fit(
            raylight_loop, config=job, num_workers=NUM_WORKERS, strategy=strategy,
            progress=False, storage_path=job["storage_path"], name="bench",
        )
    finally:
        ray.shutdown()


def torchrun_worker(job: dict[str, Any]) -> None:
    """One torchrun process: FSDP2 by hand, the way its docs show it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = dict(job, _rss_base=rss_bytes())
    model = make_model(job)
    for module in model:
        if isinstance(module, Block):
            fully_shard(module)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    record = measured(model, opt, job, rank, world)
    start = time.perf_counter()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, opt_state = get_state_dict(model, opt, options=options)
    if rank == 0:
        buffer = io.BytesIO()
        torch.save({"model": model_state, "opt": opt_state}, buffer)
        Path(job["storage_path"]).mkdir(parents=True, exist_ok=True)
        Path(job["storage_path"], "checkpoint.pt").write_bytes(buffer.getvalue())
    record["checkpoint_save_s"] = time.perf_counter() - start
    write_worker(job, record)
    dist.destroy_process_group()


CHILDREN = {"raylight": child_raylight, "torchrun-worker": torchrun_worker}


def child_command(system: str, job: dict[str, Any]) -> list[str]:
    this_file = str(Path(__file__).resolve())
    if system == "torchrun_fsdp":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
        launcher += ["--nproc_per_node", str(NUM_WORKERS), "--master_addr", "127.0.0.1"]
        launcher += ["--master_port", str(free_port()), this_file]
        return [*launcher, "--child", "torchrun-worker", "--job", json.dumps(job)]
    return script_command(this_file, "raylight", job)


# -- the parent ---------------------------------------------------------------------------


def run_once(system: str, base_job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    run = ChildRun(dict(base_job, system=system), prefix="rls-")
    record: dict[str, Any] = {"system": system, "ok": False}
    run.launch(child_command(system, run.job), timeout_s)
    record["process_s"] = run.process_s
    record["leftover_pids"] = run.reap()
    if run.error is not None:
        record["error"] = run.error
        return run.finish(record)
    workers = []
    for rank in range(NUM_WORKERS):
        path = Path(run.job["result_path"] + f".{rank}")
        if not path.exists():
            record["error"] = f"worker {rank} wrote no result"
            return run.finish(record)
        workers.append(json.loads(path.read_text()))
    record["workers"] = workers
    record["state_bytes"] = max(w["state_bytes"] for w in workers)
    record["rss_delta"] = max(w["rss_delta"] for w in workers)
    record["peak_rss"] = max(w["peak_rss"] for w in workers)
    zero = next(w for w in workers if w["rank"] == 0)
    for key in ("steady_samples_per_s", "step_s", "checkpoint_save_s"):
        record[key] = zero[key]
    return run.finish(record)


METRICS = ("state_bytes", "rss_delta", "peak_rss", "steady_samples_per_s", "checkpoint_save_s", "process_s")


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    job = {"width": args.width, "layers": args.layers, "steps": args.steps, "batch_size": 32}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for rep in range(args.reps):
        for name in SYSTEMS:  # interleaved, so drift hits every system alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            record = run_once(name, job, args.timeout)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    med = {
        name: {m: (statistics.median(v) if (v := [r[m] for r in rs if r["ok"]]) else None) for m in METRICS}
        for name, rs in reps.items()
    }
    ddp, fsdp, torchrun = med["raylight_ddp"], med["raylight_fsdp"], med["torchrun_fsdp"]
    figures = {
        "fsdp_memory_vs_ddp": ratio(fsdp["state_bytes"], ddp["state_bytes"]),
        "fsdp_rss_vs_ddp": ratio(fsdp["rss_delta"], ddp["rss_delta"]),
        "fsdp_throughput_vs_ddp": ratio(fsdp["steady_samples_per_s"], ddp["steady_samples_per_s"]),
        "raylight_fsdp_vs_torchrun_fsdp_throughput": ratio(
            fsdp["steady_samples_per_s"], torchrun["steady_samples_per_s"]
        ),
        "raylight_fsdp_vs_torchrun_fsdp_memory": ratio(fsdp["state_bytes"], torchrun["state_bytes"]),
    }
    memory = figures["fsdp_memory_vs_ddp"]
    params = sum(p.numel() for p in make_model(job).parameters())
    return {
        "config": {
            **job, "parameters": params, "num_workers": NUM_WORKERS, "reps": args.reps,
            "skip_steps": SKIP_STEPS, "optimizer": "Adam", "dtype": "float32", "backend": "gloo (CPU)",
            "torch_threads_per_worker": 1,
        },
        "machine": machine_info(),
        "medians": med,
        "reps": reps,
        "figures": figures,
        "goals": {"fsdp_memory_vs_ddp": {"goal": f"<= {MEMORY_GOAL}", "met": memory is not None and memory <= MEMORY_GOAL}},
    }


def print_table(results: dict[str, Any]) -> None:
    mib = 1024 * 1024
    print(f"\n{results['config']['parameters'] / 1e6:.1f} M parameters, {NUM_WORKERS} workers (medians; memory: the larger worker)")
    print(f"{'system':<15} {'state MiB':>10} {'rss delta MiB':>14} {'peak rss MiB':>13} {'samples/s':>10} {'ckpt save s':>12}")
    for name, m in results["medians"].items():
        if m["state_bytes"] is None:
            print(f"{name:<15} failed")
            continue
        print(
            f"{name:<15} {m['state_bytes'] / mib:>10.0f} {m['rss_delta'] / mib:>14.0f} {m['peak_rss'] / mib:>13.0f} "
            f"{m['steady_samples_per_s']:>10.1f} {m['checkpoint_save_s']:>12.2f}"
        )
    for key, value in results["figures"].items():
        print(f"{key:<42} {'-' if value is None else f'{value:.3f}'}")
    goal = results["goals"]["fsdp_memory_vs_ddp"]
    print(f"fsdp_memory_vs_ddp goal {goal['goal']}: {'met' if goal['met'] else 'NOT met'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds per child run")
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

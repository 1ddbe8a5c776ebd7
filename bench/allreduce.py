"""DDP's gradient all-reduce on CPU: gloo against raylight's shared-memory all-reduce.

Run:  make bench-allreduce     (or: python bench/allreduce.py [--reps 3])

Two ranks on this machine, started with torch.multiprocessing (no Ray: this measures the
collective, not raylight's start), a gloo group on loopback:

1. latency: one all-reduce of a float32 tensor of each size (1 KiB to 1 MiB, the largest
   bucket raylight reduces through shared memory), back to back, gloo's
   ``dist.all_reduce`` against ``SharedMemoryAllReduce.sum_``;
2. training steps: the model of bench/declarative.py's diamonds config (an MLP 30-64-32-5,
   Adam, 128 rows per rank per step) and a larger one (MLP 256-1024-1024-10: 1.3 M
   parameters, 5 MiB of gradients, so one bucket goes through gloo either way), with
   raylight's DDP strategy: ``DDP(shared_memory=False)`` (gloo reduces every bucket)
   against the default; and one process on the same global batch (256 rows, 2 threads).
   Milliseconds per step, after 200 warm-up steps.

Each repetition runs every variant once, interleaved. Medians, and the ratios
gloo/shared memory. Results: bench/results/allreduce.json, and a table on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, machine_info, ratio, write_results

RESULTS = Path(__file__).resolve().parent / "results" / "allreduce.json"
SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]  # bytes
MODELS = {"diamonds_mlp": (30, 64, 32, 5), "mlp_1m": (256, 1024, 1024, 10)}
WARMUP, STEPS, CALLS = 200, 1000, 1000


def _mlp(widths: tuple[int, ...]) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _steps(model: torch.nn.Module, rows: int, widths: tuple[int, ...], steps: int) -> float:
    """Milliseconds per training step, after WARMUP steps."""
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, widths[0], generator=gen), torch.randint(0, widths[-1], (rows,), generator=gen)
    for i in range(WARMUP + steps):
        if i == WARMUP:
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3


def _rank(rank: int, port: int, task: str, queue: Any) -> None:
    from raylight.config import DDP
    from raylight.worker.strategies import DDPStrategy
    from raylight.worker.strategies.shm_allreduce import SharedMemoryAllReduce

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        out: dict[str, Any] = {}
        if task == "latency":
            shared = SharedMemoryAllReduce.create()
            assert shared is not None, "no shared-memory all-reduce on this machine"
            for size in SIZES:
                t = torch.zeros(size // 4)
                calls = (("gloo", lambda t=t: dist.all_reduce(t)), ("shared_memory", lambda t=t: shared.sum_(t)))
                for name, call in calls:
                    for _ in range(50):
                        call()
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(CALLS):
                        call()
                    out[f"{name}_{size}"] = (time.perf_counter() - start) / CALLS * 1e6
            shared.close()
        else:
            model_name, how = task.split(":")
            widths = MODELS[model_name]
            strategy = DDPStrategy(DDP(shared_memory=how == "shared_memory"))
            model = strategy.wrap_model(_mlp(widths), device=torch.device("cpu"), world_size=2)
            out["ms_per_step"] = _steps(model, 128, widths, STEPS)
            strategy.close()
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def _two_ranks(task: str) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, task, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def _one_process(model_name: str) -> float:
    torch.set_num_threads(2)
    widths = MODELS[model_name]
    return _steps(_mlp(widths), 256, widths, STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    reps: list[dict[str, Any]] = []
    for rep in range(args.reps):
        row: dict[str, Any] = {"rep": rep, "latency_us": _two_ranks("latency")}
        for model_name in MODELS:
            row[model_name] = {
                "one_process": _one_process(model_name),
                **{how: _two_ranks(f"{model_name}:{how}")["ms_per_step"] for how in ("gloo", "shared_memory")},
            }
        print(row, flush=True)
        reps.append(row)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    latency = {
        str(size): {
            how: med([r["latency_us"][f"{how}_{size}"] for r in reps]) for how in ("gloo", "shared_memory")
        }
        for size in SIZES
    }
    for m in latency.values():
        m["gloo_vs_shared_memory"] = ratio(m["gloo"], m["shared_memory"])
    steps = {
        model_name: {how: med([r[model_name][how] for r in reps]) for how in ("one_process", "gloo", "shared_memory")}
        for model_name in MODELS
    }
    for m in steps.values():
        m["gloo_vs_shared_memory"] = ratio(m["gloo"], m["shared_memory"])
        m["shared_memory_vs_one_process"] = ratio(m["shared_memory"], m["one_process"])
    result = {
        "config": {"ranks": 2, "backend": "gloo (CPU), 1 torch thread per rank", "reps": args.reps, "warmup_steps": WARMUP,
                   "steps": STEPS, "calls": CALLS, "models": {k: "MLP " + "-".join(map(str, v)) for k, v in MODELS.items()},
                   "rows_per_rank_per_step": 128},
        "machine": machine_info(),
        "latency_us_by_bytes": latency,
        "ms_per_step": steps,
        "reps": reps,
    }
    write_results(RESULTS, result)
    print(f"\n{'bytes':>8} {'gloo us':>9} {'shm us':>8} {'ratio':>6}")
    for size, m in latency.items():
        print(f"{size:>8} {m['gloo']:>9.0f} {m['shared_memory']:>8.0f} {m['gloo_vs_shared_memory']:>6.1f}")
    print(f"\n{'model':14} {'1 process':>10} {'gloo':>8} {'shm':>8}  ms/step")
    for name, m in steps.items():
        print(f"{name:14} {m['one_process']:>10.3f} {m['gloo']:>8.3f} {m['shared_memory']:>8.3f}")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

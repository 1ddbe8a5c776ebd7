"""`raylight run` start-up against torchrun and Ray Train, on the same job.

Run:  python bench/launch.py [--reps 3] [--samples 60000] [--epochs 1]
      python bench/launch.py --quick   (smoke run: tiny sizes, 1 repetition)

The job is bench/overhead.py's (an MLP trained with DDP over gloo on 2 CPU workers, 1
torch thread each, global batch 128). Three systems, each a cold child process, interleaved
across repetitions:

  torchrun      `torchrun --nproc_per_node 2 overhead.py ...` (overhead's torchrun worker:
                init_process_group("gloo") from the environment, DDP, DistributedSampler)
  raylight_run  `raylight run -n 2 overhead.py ...`: the very same script and arguments, on
                an embedded local Ray the command starts
  ray_train     Ray Train's TorchTrainer with 2 workers running the same training function
                (overhead's ray_train_loop: prepare_model / prepare_data_loader)

Measured as in bench/overhead.py: rank 0 writes wall-clock timestamps, read against the
moment the parent launched the child. start_to_first_step_s (launch -> end of the first
optimizer step) is the figure this bench is about; steady_samples_per_s (after step 20)
shows that the script trains as fast under either launcher.

Results: a table on stdout and bench/results/launch.json (medians, raw repetitions,
machine info, the ratios raylight_run/torchrun and raylight_run/ray_train start-up and
raylight_run/torchrun throughput).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common import machine_info, median_of, ratio, run_child, run_once, write_results
from overhead import CHILDREN, NUM_WORKERS, SKIP_STEPS
from overhead import child_command as overhead_command

SYSTEMS = ("torchrun", "raylight_run", "ray_train")
METRICS = ("start_to_first_step_s", "wall_s", "process_s", "steady_samples_per_s")
OVERHEAD = Path(__file__).resolve().with_name("overhead.py")
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def child_command(system: str, job: dict[str, Any]) -> list[str]:
    if system == "raylight_run":
        import json

        run = [sys.executable, "-m", "raylight.cli", "run", "-n", str(NUM_WORKERS), "--storage-path", job["storage_path"]]
        return [*run, str(OVERHEAD), "--child", "torchrun-worker", "--job", json.dumps(job)]
    return overhead_command(system, job)


def medians(reps: list[dict[str, Any]]) -> dict[str, float | None]:
    return {metric: median_of(reps, metric) for metric in METRICS}


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    job = {"samples": args.samples, "epochs": args.epochs, "batch_size": 128, "lr": 0.05, "seed": 0}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for rep in range(args.reps):
        for name in SYSTEMS:  # interleaved, so drift hits every system alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            record = run_once(name, job, args.timeout, command=child_command)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    summary = {name: {"median": medians(r), "ok_reps": sum(x["ok"] for x in r), "reps": r} for name, r in reps.items()}
    med = {name: s["median"] for name, s in summary.items()}
    return {
        "config": {
            **job, "num_workers": NUM_WORKERS, "reps": args.reps, "skip_steps": SKIP_STEPS, "timeout_s": args.timeout,
            "model": "MLP 32-256-256-10 float32", "backend": "gloo (CPU)", "script": "bench/overhead.py torchrun-worker",
        },
        "machine": machine_info(),
        "systems": summary,
        "raylight_run_vs_torchrun_start": ratio(med["raylight_run"]["start_to_first_step_s"], med["torchrun"]["start_to_first_step_s"]),
        "raylight_run_vs_ray_train_start": ratio(med["raylight_run"]["start_to_first_step_s"], med["ray_train"]["start_to_first_step_s"]),
        "raylight_run_vs_torchrun_throughput": ratio(med["raylight_run"]["steady_samples_per_s"], med["torchrun"]["steady_samples_per_s"]),
    }


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'system':<14}{'first step s':>14}{'process s':>12}{'samples/s':>12}")
    for name, s in results["systems"].items():
        m = s["median"]
        cells = [m["start_to_first_step_s"], m["process_s"], m["steady_samples_per_s"]]
        print(f"{name:<14}" + "".join(f"{'-' if v is None else format(v, '.2f' if i < 2 else '.0f'):>{w}}" for i, (v, w) in enumerate(zip(cells, (14, 12, 12), strict=True))))
    for key in ("raylight_run_vs_torchrun_start", "raylight_run_vs_ray_train_start", "raylight_run_vs_torchrun_throughput"):
        value = results[key]
        print(f"{key}: {'-' if value is None else format(value, '.3f')}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run, 1 repetition")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/launch.json)")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.samples = 1, 6_400
    if args.out is None:
        args.out = RESULTS_DIR / ("launch-quick.json" if args.quick else "launch.json")
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

"""Ray Tune searches of raylight trials: fresh trial processes vs reused ones, side by side.

Run:  make bench-tune
      python bench/tune_trials.py [--reps 2] [--trials 4] [--samples 6400] [--epochs 2]
      python bench/tune_trials.py --quick  (smoke run: 3 trials, 1 repetition)

One search, two systems. The search: ``--trials`` trials (a grid over the seed) of a
raylight trainable on 2 CPU workers (``raylight.tune.trainable``, bench/overhead.py's MLP
and data, DDP over gloo, 1 torch thread per worker), one trial at a time (each takes the
machine's 2 CPUs). The systems differ in one Tune setting:

  fresh   TuneConfig(reuse_actors=False), Tune's default: every trial starts a new
          trial process, which starts new raylight worker processes
  reused  TuneConfig(reuse_actors=True): Tune hands the next trial to the process the
          last one ran in, and raylight's worker pool (docs/performance.md) gives it the
          worker processes the last trial's run ended with

Each run is a cold child process with its own local Ray; the systems are interleaved
across repetitions. Rank 0 reports, with each epoch, when the trial's first and last
steps ended and its process ID. Per run:

  search_s            Tuner.fit() called -> it returned
  next_trial_start_s  median over trials 2..N: the previous trial's last step -> this
                      trial's first step (Tune's scheduling, the trial's start, its
                      workers' start and rendezvous, the first step)
  trial_processes     distinct trial processes; worker_processes: distinct rank-0 processes

Results: a table, the ratio reused / fresh of search_s and next_trial_start_s, the goal
next_trial_start_s <= 0.5 s for reused (issue 20's warm start, for a Tune trial), and
bench/results/tune_trials.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import ChildRun, machine_info, run_child, script_command, write_results
from overhead import fmt, make_dataset, make_model, ratio

SYSTEMS = ("fresh", "reused")
NUM_WORKERS = 2
WARM_TRIAL_GOAL = 0.5  # reused: the next trial's first step within this of the last trial's end (s)
RESULTS = Path(__file__).resolve().parent / "results" / "tune_trials.json"


def trial_loop(ctx: Any, config: dict[str, Any]) -> None:
    """Plain DDP on the overhead MLP; rank 0 reports its first and last step's end."""
    torch.set_num_threads(1)
    loader = ctx.prepare_loader(make_dataset(config["samples"], config["seed"]), batch_size=128, shuffle=True, seed=0)
    model = ctx.prepare_model(make_model(config["seed"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = None
    for epoch in ctx.epochs(config["epochs"]):
        loss = torch.zeros(())
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            first = first or time.time()
        ctx.report({"epoch": epoch, "loss": float(loss), "first_step_end": first, "last_step_end": time.time(), "worker_pid": os.getpid()})


def child(job: dict[str, Any]) -> None:
    from ray import tune

    import raylight.tune as rt
    from raylight.driver import runtime

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    trainable = rt.trainable(trial_loop, num_workers=NUM_WORKERS, base_config={"samples": job["samples"], "epochs": job["epochs"]})
    called = time.time()
    grid = tune.Tuner(
        trainable,
        param_space={"seed": tune.grid_search(list(range(job["trials"])))},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=1, reuse_actors=job["system"] == "reused"
        ),
        run_config=tune.RunConfig(storage_path=job["storage_path"], name="bench", verbose=0),
    ).fit()
    search_s = time.time() - called
    trials = []
    for result in grid:
        rows = result.metrics_dataframe.to_dict("records")
        trials.append({
            "first_step_end": rows[0]["first_step_end"], "last_step_end": rows[-1]["last_step_end"],
            "trial_pid": int(rows[0]["pid"]), "worker_pid": int(rows[0]["worker_pid"]),
        })
    Path(job["result_path"]).write_text(json.dumps({"search_s": search_s, "errors": len(grid.errors), "trials": trials}))


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    trials = sorted(raw["trials"], key=lambda t: t["first_step_end"])
    gaps = [b["first_step_end"] - a["last_step_end"] for a, b in itertools.pairwise(trials)]
    return {
        "search_s": raw["search_s"],
        "next_trial_start_s": statistics.median(gaps) if gaps else None,
        "next_trial_start_each_s": gaps,
        "trial_processes": len({t["trial_pid"] for t in trials}),
        "worker_processes": len({t["worker_pid"] for t in trials}),
        "trials": len(trials),
    }


def run_once(system: str, base_job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    run = ChildRun({**base_job, "system": system}, prefix="rlt-")
    record: dict[str, Any] = {"system": system, "ok": False}
    run.launch(script_command(__file__, "search", run.job), timeout_s)
    record["process_s"] = run.process_s
    record["leftover_pids"] = run.reap()
    if run.error is not None:
        record["error"] = run.error
    else:
        try:
            raw = json.loads(Path(run.job["result_path"]).read_text())
        except (OSError, ValueError):
            record["error"] = "the search wrote no result"
        else:
            if raw["errors"] or len(raw["trials"]) != base_job["trials"]:
                record["error"] = f"{raw['errors']} trial(s) failed, {len(raw['trials'])} of {base_job['trials']} reported"
            else:
                record.update(summarise(raw))
    return run.finish(record)


METRICS = ("search_s", "next_trial_start_s", "trial_processes", "worker_processes")


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    job = {"trials": args.trials, "samples": args.samples, "epochs": args.epochs}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for rep in range(args.reps):
        for name in SYSTEMS:  # interleaved, so drift hits both alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            record = run_once(name, job, args.timeout)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    summary = {}
    for name, runs in reps.items():
        ok = [r for r in runs if r["ok"]]
        median = {m: statistics.median(r[m] for r in ok) if ok else None for m in METRICS}
        summary[name] = {"median": median, "ok_reps": len(ok), "reps": runs}
    fresh, reused = summary["fresh"]["median"], summary["reused"]["median"]
    warm = reused["next_trial_start_s"]
    return {
        "config": {**job, "num_workers": NUM_WORKERS, "reps": args.reps, "timeout_s": args.timeout,
                   "model": "MLP 32-256-256-10 float32", "backend": "gloo (CPU)", "torch_threads_per_worker": 1,
                   "max_concurrent_trials": 1},
        "machine": machine_info(),
        "systems": summary,
        "reused_vs_fresh_search": ratio(reused["search_s"], fresh["search_s"]),
        "reused_vs_fresh_next_trial_start": ratio(warm, fresh["next_trial_start_s"]),
        "warm_trial_start_s": warm,
        "warm_trial_start_goal_met": None if warm is None else warm <= WARM_TRIAL_GOAL,
    }


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'system':<8} {'ok':>5} {'search s':>9} {'next trial start s':>19} {'trial procs':>12} {'worker procs':>13}")
    for name, s in results["systems"].items():
        m = s["median"]
        print(
            f"{name:<8} {s['ok_reps']}/{len(s['reps']):<3} {fmt(m['search_s'], '.2f'):>9} {fmt(m['next_trial_start_s'], '.2f'):>19} "
            f"{fmt(m['trial_processes'], '.0f'):>12} {fmt(m['worker_processes'], '.0f'):>13}"
        )
        for rep in s["reps"]:
            if not rep["ok"]:
                print(f"  {name} FAILED: {rep['error']}\n    " + rep.get("stderr_tail", "")[-600:])
    print(f"reused / fresh search time:      {fmt(results['reused_vs_fresh_search'], '.3f')}")
    print(f"reused / fresh next trial start: {fmt(results['reused_vs_fresh_next_trial_start'], '.3f')}")
    print(
        f"reused next trial start:         {fmt(results['warm_trial_start_s'], '.3f')} s "
        f"(goal <= {WARM_TRIAL_GOAL} s: {results['warm_trial_start_goal_met']})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2, help="repetitions of each system")
    parser.add_argument("--trials", type=int, default=4, help="trials per search (at least 2)")
    parser.add_argument("--samples", type=int, default=6_400, help="samples per epoch of a trial")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per search")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 trials, 1 repetition")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/tune_trials.json)")
    parser.add_argument("--child", choices=["search"], help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trials < 2:
        parser.error(f"--trials must be at least 2 (the next trial's start is what is timed), got {args.trials}")
    if args.quick:
        args.reps, args.trials, args.samples, args.epochs = 1, 3, 1_280, 1
    if args.out is None:
        args.out = RESULTS.with_name("tune_trials-quick.json") if args.quick else RESULTS
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if run_child(args, {"search": child}):
        return
    results = run_benchmark(args)
    print_table(results)
    write_results(args.out, results)


if __name__ == "__main__":
    sys.exit(main())

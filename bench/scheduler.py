"""Cluster scheduling on the Pollux evaluation workloads: raylight's SharingPolicy vs peers.

Run:  make bench-scheduler     (or: python bench/scheduler.py [--quick] [--workloads 6])

A trace-driven simulator of our own (bench/scheduler_sim/: pure Python and numpy, no Ray)
on the inputs of Pollux's evaluation (OSDI'21 section 5.3, AdaptDL's ``osdi21-artifact``
branch, shipped in bench/data/pollux/): the 8 workloads of 160 job arrivals each and the
throughput and gradient-statistics traces of the 6 applications measured on 16 nodes x 4
GPUs, the cluster simulated here. Every 60 s the policy re-decides; a changed allocation
costs the job 30 s; jobs progress at their true goodput from the traces (cluster.py says
how). Policies, on the same workloads and the same simulator:

- ``sharing``: raylight.adaptive.sharing.SharingPolicy, adaptive replicas and batch size,
  each job with the goodput model it learned from what it ran;
- ``tiresias``: raylight's re-implementation of Tiresias (2D-LAS), tuned fixed sizes;
- ``fifo`` and ``fair``: tuned fixed sizes, first come first served / max-min fair share.

Pollux itself is quoted, not measured: the artifact's own per-job results for its Pollux,
Tiresias and Optimus+Oracle policies on the same 8 workloads
(bench/data/pollux/reference/, from results-jobload/*-1.0/summary.json). Running its
simulator here is too slow for a bench (docs/scheduler.md, "Pollux as a peer").
So the ``*_vs_pollux`` figures compare two simulators built on the same traces;
``tiresias_vs_quoted`` (our Tiresias in our simulator over theirs in theirs) is the check
of how far the two simulators agree.

Figures per workload and their mean over workloads (goals from issue 58):
avg_jct_vs_pollux (<= 1.0), avg_jct_vs_tiresias (<= 0.68, both in this simulator),
p99_jct_vs_pollux, makespan_vs_pollux; and decision_s_100_jobs, the SharingPolicy's time
for one decision with 100 jobs on 64 GPUs (< 1 s). Results: bench/results/scheduler.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from raylight.adaptive.cloud import GAIN_PER_USD_H, CloudSettings
from raylight.adaptive.sharing import SharingPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, ratio, write_results
from scheduler_sim import policies
from scheduler_sim.cloud import autoscaler
from scheduler_sim.cluster import Outcome, simulate
from scheduler_sim.traces import (
    DATA,
    MAX_EPOCHS,
    load_application,
    load_reference,
    load_workload,
)

RESULTS = Path(__file__).resolve().parent / "results" / "scheduler.json"
POLICIES = ("sharing", "tiresias", "fair", "fifo")
QUOTED = ("pollux", "tiresias", "optimus")


def make_policy(name: str, args: argparse.Namespace) -> tuple[Any, bool]:
    """(the simulator policy, whether its jobs adapt their batch)."""
    if name in ("sharing", "cloud"):
        decide, _ = policies.sharing(
            p=args.p, horizon_s=args.horizon_s, restart_s=args.restart_s, order=args.order,
            baseline=args.baseline,
        )
        return decide, True
    return {"tiresias": policies.tiresias, "fair": policies.fair, "fifo": policies.fifo}[name](), False


def run_one(task: tuple[int, str, argparse.Namespace]) -> dict[str, Any]:
    number, name, args = task
    apps = {a: load_application(a) for a in MAX_EPOCHS}
    arrivals = load_workload(DATA / "workloads" / f"workload-{number}.csv")
    if args.limit_jobs:
        arrivals = arrivals[: args.limit_jobs]
    policy, adaptive = make_policy(name, args)
    scale, timings = None, []
    if name == "cloud":
        scale = autoscaler(
            policy=SharingPolicy(p=args.p, horizon_s=args.horizon_s, baseline=args.baseline),
            settings=CloudSettings(gain_per_usd_h=args.gain_per_usd_h, max_nodes=16, release_after_s=args.release_after_s),
            price_per_node_h=args.price_per_node_h, join_s=args.join_s, restart_s=args.restart_s, order=args.order,
            timings=timings,
        )
    out = simulate(
        arrivals, apps, policy, adaptive=adaptive,
        interval_s=args.interval_s, restart_s=args.restart_s, scale=scale,
    )
    row = {"workload": number, "policy": name, **summarise(out)}
    row["node_hours"] = out.node_seconds / 3600
    row["cost_usd"] = row["node_hours"] * args.price_per_node_h
    if timings:
        row["cloud_decision_s_mean"] = statistics.fmean(timings)
        row["cloud_decision_s_max"] = max(timings)
    return row


def summarise(out: Outcome) -> dict[str, Any]:
    return {
        "jobs": len(out.jcts),
        "avg_jct_s": out.avg_jct,
        "p99_jct_s": out.p99_jct,
        "makespan_s": out.makespan,
        "restarts": out.restarts,
        "gpu_utilisation": out.gpu_utilisation,
        "max_gpus_used": out.max_gpus_used,
        "decisions": len(out.decision_s),
        "decision_s_mean": statistics.fmean(out.decision_s),
        "decision_s_max": max(out.decision_s),
        "wall_s": out.wall_s,
    }


def quoted(policy: str, number: int, limit: int | None) -> dict[str, Any] | None:
    ref = load_reference(policy)["jcts"].get(f"workload-{number}")
    if not ref:
        return None
    arrivals = load_workload(DATA / "workloads" / f"workload-{number}.csv")
    if limit:  # the artifact ran every job; a prefix of its JCTs is only indicative
        arrivals = arrivals[:limit]
    jcts = [ref[a.name] for a in arrivals if a.name in ref]
    completion = [a.time + ref[a.name] for a in arrivals if a.name in ref]
    return {
        "jobs": len(jcts),
        "avg_jct_s": float(np.mean(jcts)),
        "p99_jct_s": float(np.percentile(jcts, 99)),
        "makespan_s": float(max(completion)),
    }


def source_commit() -> dict[str, Any]:
    """The commit the figures came from, and whether the tree differed from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*cmd: str) -> str:
        out = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--", "src", "bench/scheduler.py", "bench/scheduler_sim")
    return {"commit": git("rev-parse", "HEAD") or None, "uncommitted_changes": bool(dirty)}


def decision_time(reps: int = 5, jobs: int = 100) -> dict[str, Any]:
    """Seconds per SharingPolicy.allocate: ``jobs`` jobs, each with a goodput model fitted
    on four layouts of its application's traces, on 16 nodes x 4 GPUs."""
    from raylight.adaptive.goodput import GoodputFunction, GradParams
    from raylight.adaptive.perf_model import fit_perf_params
    from raylight.adaptive.sharing import JobModel, SharingPolicy

    names = [a for a in MAX_EPOCHS if a != "ncf"]
    apps = {a: load_application(a) for a in names}
    layouts = [((1,), 1), ((2,), 2), ((4,), 4), ((4, 4), 8)]
    models = []
    for i in range(jobs):
        app = apps[names[i % len(names)]]
        m = [app.min_local_bsz, app.max_local_bsz]
        rows = [(len(p), sum(p), b, *app.step_time(p, b)) for p, _ in layouts for b in m]
        n, r, b, step, sync = (np.array(col, float) for col in zip(*rows, strict=True))
        perf = fit_perf_params(n, r, b, step - sync, step)
        grad = GradParams(*app.grad_stats(app.init_batch_size, i % 5))
        good = GoodputFunction(perf, grad, app.init_batch_size)
        models.append(JobModel(
            f"job-{i}", good, max_replicas=16, max_batch_size=app.max_batch_size,
            atomic_bsz_range=(app.min_local_bsz, app.max_local_bsz), accumulation=True,
            current=(i % 16,) if i < 40 else (),
        ))
    policy = SharingPolicy()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        alloc = policy.allocate(models, [4] * 16)
        times.append(time.perf_counter() - t0)
    return {
        "jobs": jobs, "gpus": 64, "reps": reps, "seconds": times,
        "median_s": statistics.median(times),
        "running": sum(1 for a in alloc.jobs.values() if a.nodes),
    }


def figures(rows: list[dict[str, Any]], numbers: list[int], limit: int | None) -> dict[str, Any]:
    by = {(r["workload"], r["policy"]): r for r in rows}
    per: dict[str, Any] = {}
    for w in numbers:
        ref = {p: quoted(p, w, limit) for p in QUOTED}
        ours = {p: by.get((w, p)) for p in POLICIES}
        s, t, pol = ours["sharing"], ours["tiresias"], ref["pollux"]

        def get(row: dict[str, Any] | None, key: str) -> float | None:
            return row[key] if row else None

        per[f"workload-{w}"] = {
            "measured": {p: r for p, r in ours.items() if r},
            "quoted": ref,
            "avg_jct_vs_pollux": ratio(get(s, "avg_jct_s"), get(pol, "avg_jct_s")),
            "avg_jct_vs_tiresias": ratio(get(s, "avg_jct_s"), get(t, "avg_jct_s")),
            "avg_jct_vs_tiresias_quoted": ratio(get(s, "avg_jct_s"), get(ref["tiresias"], "avg_jct_s")),
            "p99_jct_vs_pollux": ratio(get(s, "p99_jct_s"), get(pol, "p99_jct_s")),
            "makespan_vs_pollux": ratio(get(s, "makespan_s"), get(pol, "makespan_s")),
            "tiresias_vs_quoted": ratio(get(t, "avg_jct_s"), get(ref["tiresias"], "avg_jct_s")),
            "avg_jct_vs_fifo": ratio(get(s, "avg_jct_s"), get(ours["fifo"], "avg_jct_s")),
            "avg_jct_vs_fair": ratio(get(s, "avg_jct_s"), get(ours["fair"], "avg_jct_s")),
        }
    keys = [k for k in next(iter(per.values())) if k not in ("measured", "quoted")]
    mean = {}
    for k in keys:
        vals = [v[k] for v in per.values() if v[k] is not None]
        mean[k] = statistics.fmean(vals) if vals else None
    return {"per_workload": per, "mean": mean}


# A node of the paper's testbed (4 NVIDIA T4 GPUs, AWS g4dn.12xlarge), USD per hour on
# demand (list price, us-east-1): the cloud row's price per node-hour, a setting.
PRICE_PER_NODE_H = 3.912


def cloud_figures(rows: list[dict[str, Any]], numbers: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Cloud mode against the fixed 16-node cluster, the same policy and workload."""
    by = {(r["workload"], r["policy"]): r for r in rows}
    per = {}
    for w in numbers:
        cloud, fixed = by.get((w, "cloud")), by.get((w, "sharing"))
        if not cloud or not fixed:
            continue
        per[f"workload-{w}"] = {
            "cost_usd": cloud["cost_usd"], "fixed_cost_usd": fixed["cost_usd"],
            "avg_jct_s": cloud["avg_jct_s"], "fixed_avg_jct_s": fixed["avg_jct_s"],
            "cost_vs_fixed": ratio(cloud["cost_usd"], fixed["cost_usd"]),
            "avg_jct_vs_fixed": ratio(cloud["avg_jct_s"], fixed["avg_jct_s"]),
            "makespan_vs_fixed": ratio(cloud["makespan_s"], fixed["makespan_s"]),
        }
    return {
        "price_per_node_h": args.price_per_node_h, "gain_per_usd_h": args.gain_per_usd_h, "join_s": args.join_s,
        "release_after_s": args.release_after_s, "max_nodes": 16,
        "fixed": "the sharing row: 16 nodes on from the first arrival to the last completion, each node-hour paid",
        "per_workload": per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="workload 6, its first 60 jobs (the smoke run)")
    parser.add_argument("--workloads", default="1,2,3,4,5,6,7,8", help="workload numbers (1-8)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--limit-jobs", type=int, default=0, help="only each workload's first N arrivals")
    parser.add_argument("--interval-s", type=float, default=60.0, help="scheduling interval")
    parser.add_argument("--restart-s", type=float, default=30.0, help="cost of a changed allocation")
    parser.add_argument("--horizon-s", type=float, default=600.0, help="SharingPolicy: a resize's cost is charged over it")
    parser.add_argument("--p", type=float, default=-1.0, help="SharingPolicy: power of the fitness mean")
    parser.add_argument("--baseline", default="min", choices=["min", "fair"], help="SharingPolicy: speedup over the job's minimum or over a fair share")
    parser.add_argument("--order", default="service", choices=["arrival", "service"], help="SharingPolicy: admission order")
    parser.add_argument("--cloud", action="store_true", help="add the cloud mode row (an autoscaled cluster of at most 16 nodes) beside the fixed sharing row")
    parser.add_argument("--price-per-node-h", type=float, default=PRICE_PER_NODE_H, help="cloud: USD per node-hour (4 GPUs)")
    parser.add_argument("--gain-per-usd-h", type=float, default=GAIN_PER_USD_H, help="cloud: job-speedup a node must add per USD/h")
    parser.add_argument("--join-s", type=float, default=60.0, help="cloud: seconds from asking for a node to its joining")
    parser.add_argument("--release-after-s", type=float, default=60.0, help="cloud: seconds a node stays unused before it goes")
    parser.add_argument("--procs", type=int, default=2, help="simulations in parallel")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.workloads, args.limit_jobs = "6", args.limit_jobs or 60
        if args.out == RESULTS:
            args.out = RESULTS.with_name("scheduler-quick.json")
    if args.cloud:
        if args.out == RESULTS:
            args.out = RESULTS.with_name("scheduler-cloud.json")
        if args.policies == ",".join(POLICIES):
            args.policies = "sharing"
    numbers = [int(w) for w in args.workloads.split(",")]
    names = args.policies.split(",") + (["cloud"] if args.cloud else [])
    tasks = [(w, p, args) for w in numbers for p in names]
    started = time.perf_counter()
    with Pool(min(args.procs, len(tasks))) as pool:
        rows = []
        for row in pool.imap_unordered(run_one, tasks):
            print(f"workload {row['workload']} {row['policy']:9s} avg JCT {row['avg_jct_s']:8.0f} s  "
                  f"p99 {row['p99_jct_s']:8.0f} s  makespan {row['makespan_s']:8.0f} s  ({row['wall_s']:.1f} s)", flush=True)
            rows.append(row)
    result = {
        "config": {
            "cluster": "16 nodes x 4 GPUs (simulated)",
            "workloads": numbers,
            "limit_jobs": args.limit_jobs or None,
            "interval_s": args.interval_s,
            "restart_s": args.restart_s,
            "sharing": {"p": args.p, "horizon_s": args.horizon_s, "order": args.order, "baseline": args.baseline},
            "price_per_node_h": args.price_per_node_h,
            "inputs": "AdaptDL osdi21-artifact c793c7089bd307462686339d29707925c461f9a9 (bench/data/pollux/README.md)",
            "quoted": "pollux/tiresias/optimus: the artifact's results-jobload/*-1.0 per-job JCTs, from its own simulator, not measured here",
        },
        "machine": machine_info(),
        "source": source_commit(),
        **figures(rows, numbers, args.limit_jobs or None),
        **({"cloud": cloud_figures(rows, numbers, args)} if args.cloud else {}),
        "decision_s_100_jobs": decision_time(),
        "runs": sorted(rows, key=lambda r: (r["workload"], r["policy"])),
        "wall_s": time.perf_counter() - started,
    }
    write_results(args.out, result)
    mean = result["mean"]
    for k, v in mean.items():
        print(f"{k:28s} {v:.3f}" if v is not None else f"{k:28s} -")
    print(f"decision_s_100_jobs          {result['decision_s_100_jobs']['median_s']:.4f}")


if __name__ == "__main__":
    main()

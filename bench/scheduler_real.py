"""Many jobs, one real cluster: three adaptive jobs through the raylight scheduler against
the same three at a fixed share (issue 58, the real-run half of bench/scheduler.py).

Run:  make bench-scheduler-real     (or: python bench/scheduler_real.py [--slots-per-node 2])

A fake cluster of loopback nodes (``ray.cluster_utils.Cluster``, 3 nodes of 2 logical
CPUs: 6 slots) made and shut down here. Three jobs (``JOBS``: tests/support/loops.py's
``elastic_loop``, a linear regression in float64, with different step costs so their
efficiencies differ) are submitted at staggered times, each as a driver process of its
own connecting to the cluster (``--child job``), twice on the same cluster with the same
seeds:

- ``scheduler``: the raylight scheduler actor runs; each job is elastic (1 to 4
  workers) and adaptive, and takes the allocation the scheduler gives it;
- ``fixed``: no scheduler; each job at a fixed share of the slots (6 / 3 = 2 workers),
  its batch size fixed.

Per job: submit and finish time (from the start of the phase), JCT (submit to the
driver's exit), final loss (the mean training loss of its last epoch), its allocation
rows and resizes (adaptive.jsonl), and how long it waited for slots. Figures:
``avg_jct_vs_fixed_share``, ``makespan_vs_fixed_share``, ``all_finished``, and per job
its final loss against the same job at the fixed share: a job whose batch size does not
adapt (``adaptive: False``) computes the same steps at any worker count, so its loss must
equal to 1e-5 (``exact``); an adaptive job's batch follows its allocation, so its loss is
compared to the spread of the jobs' losses (``noise``). No job runs alone: a job's
numerics do not depend on the others, so the fixed-share run stands for its solo run.
Results: bench/results/scheduler-real.json, and scheduler-real.png (the scheduler
phase's workers per job over time, from its runs' adaptive.jsonl). One run on a loaded 2-core machine: the times
are this machine's, not a cluster's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if __package__:  # imported as bench.scheduler_real (tests/bench): bench/ stays off sys.path, whose
    # lightning.py would stand for the real Lightning in the rest of that pytest run
    from bench.common import child_env, machine_info, ratio, write_results
else:  # run as a script
    sys.path.insert(0, str(BENCH))
    from common import child_env, machine_info, ratio, write_results  # type: ignore[no-redef]

RESULTS = BENCH / "results" / "scheduler-real.json"
PLOT = BENCH / "results" / "scheduler-real.png"  # workers per job over time, from the runs' adaptive.jsonl
# name -> when it is submitted (s after the phase starts) and its loop's config
JOBS: dict[str, dict[str, Any]] = {
    "a": {"submit_s": 0.0, "config": {"n": 480, "step_s": 0.05, "epochs": 20, "adaptive": True}},
    "b": {"submit_s": 15.0, "config": {"n": 240, "step_s": 0.0, "epochs": 30, "adaptive": True}},
    "c": {"submit_s": 30.0, "config": {"n": 360, "step_s": 0.02, "epochs": 15, "adaptive": False}},
}
FIXED_SHARE = 2  # workers per job in the fixed phase: 6 slots / 3 jobs
JOB_TIMEOUT_S = 600.0  # --job-timeout-s: one job's driver, submit to exit
EXACT_TOL = 1e-5


# -- a job's driver (a child process) ---------------------------------------------------


def run_job(job: dict[str, Any]) -> None:
    """One job's driver: connect to the cluster, train, write the result file."""
    from raylight.driver import runtime

    runtime._force_loopback()
    import ray

    import raylight
    from raylight import AdaptiveConfig, RunConfig, ScalingConfig, TrainerConfig
    from tests.support import loops

    ray.init(address=job["address"], logging_level="ERROR")
    spec = job["config"]
    scheduled = job["mode"] == "scheduler"
    config = {"batch_size": 16, "n": spec["n"], "epochs": spec["epochs"], "step_s": spec["step_s"],
              "checkpoint_every": 1000, "adaptive": spec["adaptive"] and scheduled}
    trainer = raylight.Trainer(
        loops.elastic_loop, train_loop_config=config,
        config=TrainerConfig(
            scaling=ScalingConfig(num_workers=(1, 4) if scheduled else FIXED_SHARE, resize_interval_s=0.5),
            adaptive=AdaptiveConfig(decision_interval_s=1.0, min_profile_steps=2) if scheduled else None,
            run=RunConfig(storage_path=job["workdir"], name=job["name"], progress=False),
        ),
    )
    result = trainer.fit()
    epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
    last = epochs[-1]
    Path(job["result_path"]).write_text(json.dumps({
        "final_loss": last["sse"] / last["count"], "epochs": len(epochs),
        "workers_by_epoch": [m["workers"] for m in epochs], "batch_by_epoch": [m["batch"] for m in epochs],
        "resizes": result.resizes,
    }, default=str))
    ray.shutdown()


# -- a phase: three drivers on the cluster ------------------------------------------------


def read_trace(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "adaptive.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


STATUS_EVERY_S = 1.0  # how often the scheduler phase records the scheduler's status
STATUS_TIMEOUT_S = 5.0  # each status call's timeout


def watch_scheduler(handle: Any, t0: float, done: threading.Event, out: list[dict[str, Any]]) -> None:
    """The scheduler's view (each job's workers) over the phase, where it changes."""
    import ray

    last = None
    while not done.wait(STATUS_EVERY_S):
        try:
            status = ray.get(handle.status.remote(), timeout=STATUS_TIMEOUT_S)
        except Exception as exc:  # a missed sample; recorded as such
            out.append({"t_s": round(time.monotonic() - t0, 2), "error": type(exc).__name__})
            continue
        view = {j["job_id"]: j.get("workers") for j in status.get("jobs", [])}
        if view != last:
            out.append({"t_s": round(time.monotonic() - t0, 2), "workers": view, "dropped": list(status.get("dropped", []))})
            last = view


def run_phase(mode: str, address: str, workdir: Path, timeout_s: float, handle: Any = None) -> dict[str, Any]:
    """The three jobs submitted at their times; each one's record (and, with the
    scheduler's ``handle``, its view over the phase under ``"_scheduler_view"``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    view: list[dict[str, Any]] = []
    done = threading.Event()
    procs: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    t0 = time.monotonic()
    watcher = threading.Thread(target=watch_scheduler, args=(handle, t0, done, view), daemon=True) if handle else None
    if watcher:
        watcher.start()
    for name, job in sorted(JOBS.items(), key=lambda kv: kv[1]["submit_s"]):
        time.sleep(max(0.0, t0 + job["submit_s"] - time.monotonic()))  # the staggered submit times
        result_path = workdir / f"{name}.result.json"
        child = {"name": name, "mode": mode, "address": address, "workdir": str(workdir),
                 "config": job["config"], "result_path": str(result_path)}
        log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed when the child exits)
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "job", "--job", json.dumps(child)],
            cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        procs[name] = (proc, time.monotonic() - t0, result_path)
    records: dict[str, Any] = {}
    traces: dict[str, list[dict[str, Any]]] = {}
    for name, (proc, submitted, result_path) in procs.items():
        left = max(1.0, t0 + submitted + timeout_s - time.monotonic())
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # our child's own session, by its id
            proc.wait()
        finished = time.monotonic() - t0
        ok = proc.returncode == 0 and result_path.exists()
        trace = read_trace(workdir / name)
        allocations = [{k: r[k] for k in ("time", "workers", "nodes", "speedup", "waiting")}
                       for r in trace if r.get("event") == "allocation"]
        traces[name] = trace
        records[name] = {
            "ok": ok, "returncode": proc.returncode, "submit_s": round(submitted, 2),
            "finish_s": round(finished, 2), "jct_s": round(finished - submitted, 2),
            **(json.loads(result_path.read_text()) if ok else
               {"error": (workdir / f"{name}.log").read_text()[-3000:]}),
            "allocations": allocations,
            "waiting_allocations": sum(1 for a in allocations if a["waiting"]),
            "resized": [{k: r.get(k) for k in ("time", "from", "to", "reason")} for r in trace if r.get("event") == "resized"],
        }
    done.set()
    if watcher:
        watcher.join(STATUS_TIMEOUT_S + STATUS_EVERY_S)
        records["_scheduler_view"] = view
    records["_traces"] = traces
    return records


def plot_phase(traces: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """The scheduler phase's workers per job over time, from its runs' adaptive.jsonl rows."""
    from raylight.scheduler import plot

    told, running = plot.from_traces(traces)
    return plot.plot_workers(path, running, told=told, title="workers per job, through the raylight scheduler")


def _env() -> dict[str, str]:
    env = {k: v for k, v in child_env().items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    env["RAY_AUTH_MODE"] = "token"
    return env


# -- the figures ----------------------------------------------------------------------------


def figures(sched: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    done = all(r["ok"] for r in (*sched.values(), *fixed.values()))
    out: dict[str, Any] = {"all_finished": done}
    if not done:
        return out
    avg = {k: sum(r["jct_s"] for r in v.values()) / len(v) for k, v in (("sched", sched), ("fixed", fixed))}
    span = {k: max(r["finish_s"] for r in v.values()) for k, v in (("sched", sched), ("fixed", fixed))}
    losses = [r["final_loss"] for r in fixed.values()]
    noise = max(losses) - min(losses)
    per_job = {}
    for name, r in sched.items():
        diff = abs(r["final_loss"] - fixed[name]["final_loss"])
        exact = not JOBS[name]["config"]["adaptive"]
        per_job[name] = {"loss_scheduler": r["final_loss"], "loss_fixed_share": fixed[name]["final_loss"],
                         "abs_diff": diff, "comparison": "exact" if exact else "noise",
                         "tolerance": EXACT_TOL if exact else noise,
                         "within": diff <= (EXACT_TOL if exact else noise),
                         "mean_workers": _mean_workers(r)}
    out.update({
        "avg_jct_s": avg, "makespan_s": span,
        "avg_jct_vs_fixed_share": ratio(avg["sched"], avg["fixed"]),
        "makespan_vs_fixed_share": ratio(span["sched"], span["fixed"]),
        "loss_vs_fixed_share": per_job,
        "max_waiting_allocations": max(r["waiting_allocations"] for r in sched.values()),
    })
    return out


def _mean_workers(r: dict[str, Any]) -> float:
    w = r.get("workers_by_epoch") or [0]
    return sum(w) / len(w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["job"])
    parser.add_argument("--job")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--job-timeout-s", type=float, default=JOB_TIMEOUT_S)
    parser.add_argument("--workdir", default="/tmp/rlb-scheduler-real")
    args = parser.parse_args()
    if args.child:
        run_job(json.loads(args.job))
        return
    os.environ.update(_env())  # the cluster's workers import the loop from this checkout
    from raylight.driver import runtime

    runtime._force_loopback()
    import ray
    from ray.cluster_utils import Cluster

    from raylight.scheduler import actor

    started = time.time()
    workdir = Path(args.workdir) / time.strftime("%Y%m%d-%H%M%S")
    with runtime._lean_head():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        try:
            for _ in range(args.nodes - 1):
                cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, logging_level="ERROR")
            handle = actor.start()
            sched = run_phase("scheduler", cluster.address, workdir / "scheduler", args.job_timeout_s, handle)
            scheduler_view = sched.pop("_scheduler_view")
            plot_phase(sched.pop("_traces"), PLOT)
            actor.stop()
            fixed = run_phase("fixed", cluster.address, workdir / "fixed", args.job_timeout_s)
            fixed.pop("_traces")
        finally:
            ray.shutdown()
            cluster.shutdown()
    write_results(RESULTS, {
        "bench": "scheduler-real", "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "machine": {**machine_info(), "load_average": os.getloadavg()},
        "cluster": {"nodes": args.nodes, "cpus_per_node": 2}, "jobs": JOBS, "fixed_share_workers": FIXED_SHARE,
        "wall_s": round(time.time() - started, 1),
        "figures": figures(sched, fixed), "scheduler": sched, "scheduler_view": scheduler_view, "fixed": fixed,
    })


if __name__ == "__main__":
    main()

"""`raylight run` and a drain notice: how soon the scripts' checkpoint is committed.

Run:  python bench/launch_deadlines.py [--deadlines 3,8,30] [--src DIR] [--out FILE]

The `raylight run` counterpart of bench/cluster.py's deadline_* peers (issue 53). Each
deadline runs tests/support/run_drain_driver.py in a cold child process: a fake cluster of
its own (``ray.cluster_utils.Cluster``: a head and two nodes of 1 CPU), ``raylight run -n 2``
of a script (tests/support/run_scripts.py ``drain``) that takes steps of 0.1 s ended by an
all-reduce, checkpoints through ``run_context()`` at step 0 only and asks
``should_stop()`` at every step boundary; after 10 steps the node of a worker that is not
the head is drained (``DRAIN_NODE_REASON_PREEMPTION``) and taken away without grace at its
deadline. The script runs long enough to be still training at the deadline had it not
stopped. Seconds from the drain call: the driver logs the notice, the checkpoint after the
drain is committed (its ``meta.json``), rank 0's last step before the restart, its first
step after it; the steps trained twice (a step rank 0 logged twice), and whether the
commit came before the node went.

``--src DIR`` measures another raylight source tree (the code before a change: the same
script, whose ``should_stop`` it may lack, then never stops).

Results: a table on stdout and bench/results/launch-deadlines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ChildRun, machine_info, write_results

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "launch-deadlines.json"
STEP_S = 0.1  # tests.support.run_scripts.DRAIN_STEP_S
JIT_GOAL_S = 2.0  # notice -> the scripts' checkpoint committed


def figures(data: dict[str, Any]) -> dict[str, Any]:
    t0, removed = data["drained_at"], data["removed_at"]
    steps = data["steps"]
    first = [r for r in steps if r[2] == 0]
    again = [r for r in steps if r[2] > 0]
    after = [c for c in data["checkpoints"] if c["committed"] > t0]
    keys = [r[0] for r in steps]

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    return {
        "code": data["code"],
        "node_removed_s": since(removed),
        "notice_seen_s": since(data["notice_logged"][0]) if data["notice_logged"] else None,
        "checkpoint_committed_s": since(after[0]["committed"]) if after else None,
        "committed_before_node_removed": bool(after) and after[0]["committed"] < removed,
        "last_step_before_restart_s": since(first[-1][3]) if first else None,
        "training_again_s": since(again[0][3]) if again else None,
        "steps_twice": len(keys) - len(set(keys)),
        "restarts": len({r[2] for r in steps}) - 1,
    }


def run(deadline_s: float, src: str | None, timeout_s: float) -> dict[str, Any]:
    run = ChildRun({}, prefix="rld-")
    work = run.dir / "work"
    work.mkdir()
    total = 10 + int(deadline_s / STEP_S) + 40  # still training at the deadline without a stop
    path = os.pathsep.join([src or str(REPO / "src"), str(REPO)])
    os.environ["PYTHONPATH"] = path  # ChildRun's child takes this process's environment
    command = [sys.executable, "-m", "tests.support.run_drain_driver", str(work), f"{deadline_s:g}", str(total)]
    record: dict[str, Any] = {"deadline_s": deadline_s, "ok": False, "steps": total}
    print(f"deadline {deadline_s:g}s: running (timeout {timeout_s:.0f}s)", flush=True)
    run.launch(command, timeout_s)
    record["process_s"] = round(run.process_s, 2)
    record["leftover_pids"] = run.reap()
    out = (run.dir / "stdout.log").read_text(errors="replace")
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if run.error is not None or line is None:
        record["error"] = run.error or "the child wrote no result"
    else:
        record.update(figures(json.loads(line[len("RESULT "):])))
    return run.finish(record)


def git_commit(src: str | None) -> str | None:
    where = Path(src).parent if src else REPO
    out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadlines", default="3,8,30", help="comma-separated seconds")
    parser.add_argument("--src", default=None, help="the raylight source tree to measure (default this one's src)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    began = time.time()
    records = [run(float(d), args.src, args.timeout) for d in args.deadlines.split(",")]
    cols = ("deadline_s", "notice_seen_s", "checkpoint_committed_s", "last_step_before_restart_s",
            "training_again_s", "steps_twice", "committed_before_node_removed")
    print("  ".join(f"{c:>14}" for c in cols))
    for r in records:
        print("  ".join(f"{r.get(c, r.get('error', '-'))!s:>14}" for c in cols), flush=True)
    write_results(args.out, {
        "benchmark": "launch-deadlines",
        "repetitions": 1,
        "git_commit": git_commit(args.src),
        "src": args.src or str(REPO / "src"),
        "machine": machine_info(),
        "goals": {"checkpoint_committed_s": f"< {JIT_GOAL_S} and before the node goes", "steps_twice": 0},
        "wall_s": round(time.time() - began, 1),
        "records": records,
    })


if __name__ == "__main__":
    main()

"""The parent's side of one child: launch it cold (common.ChildRun: its own session and run
directory, killed at the timeout, leftovers reaped), time it from the launch with the load
average and raylight's source fingerprint around it, and read what it wrote into a record
for its section (time to target, throughput, resize, forced layouts)."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from common import ChildRun, script_command

from adaptive_bench import TPUT_SYSTEMS

SCRIPT = Path(__file__).resolve().parents[1] / "adaptive.py"  # the children's entry point


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
    """Launch one cold child process; returns its record with the launch timestamp
    ("launched") and what it wrote ("raw"), for the section's record to take apart."""
    run = ChildRun(base_job, prefix="rla-", stop_file=True)
    # 1-minute load average around the run: other work on the machine shows up here.
    record: dict[str, Any] = {"ok": False, "loadavg_before": os.getloadavg()[0]}
    record["raylight_source"] = source_fingerprint()
    run.launch(script_command(SCRIPT, child, run.job), timeout_s)
    record["process_s"] = run.process_s
    record["loadavg_after"] = os.getloadavg()[0]
    if source_fingerprint() != record["raylight_source"]:
        record["raylight_source_changed"] = True  # edited while this child ran
    record["leftover_pids"] = run.reap()
    raw: dict[str, Any] = {}
    try:
        raw = json.loads(Path(run.job["result_path"]).read_text())
        driver = run.dir / "driver.json"
        if driver.exists():
            raw["driver"] = json.loads(driver.read_text())
        png = run.dir / "adaptive.png"
        if png.exists():
            record["_png"] = png.read_bytes()  # kept in memory only
    except (OSError, ValueError):
        pass
    if run.error is not None:
        record["error"] = run.error
    elif not raw:
        record["error"] = "the run wrote no result"
    record["launched"] = run.launched
    record["raw"] = raw
    return run.finish(record)


def ttt_record(system: str, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One time-to-target run of ``system``, timed from the launch and from its first step."""
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
    """One 1 -> 2 grow of ``kind``, checked to be the kind asked for."""
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


def sweep_record(job: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The forced layouts' run: its record, and what it wrote (the merged profile)."""
    record = run_child("sweep", job, timeout_s)
    raw = record.pop("raw")
    record.pop("launched")
    record.pop("_png", None)
    return record, raw

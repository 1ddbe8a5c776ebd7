"""One benchmark: the sections (ttt, tput, resize; sweep when asked or when the adaptive
runs saw too few layouts) over the repetitions, interleaved so that drift hits every system
alike; the results (config, machine, medians, prediction error, figures) and their files:
the JSON and the adaptive trace of the median adaptive repetition."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from common import machine_info

from adaptive_bench import (
    MIN_PROFILE_STEPS,
    NUM_WORKERS,
    RESIZE_KINDS,
    SKIP_STEPS,
    TPUT_ORDER,
    TTT_SYSTEMS,
)
from adaptive_bench.analysis import forward_summary, prediction_error
from adaptive_bench.parent import (
    resize_record,
    source_fingerprint,
    sweep_record,
    tput_record,
    ttt_record,
)
from adaptive_bench.report import fmt, print_table
from adaptive_bench.summary import figures, summarize_resize, summarize_tput, summarize_ttt
from adaptive_bench.tasks import DATASETS

SWEEP_ATOMIC = (4, 8, 16, 64, 256)  # forced layouts, when the adaptive runs saw too few


def show(label: str, record: dict[str, Any]) -> None:
    """One child's outcome, on the line its section started."""
    extra = ""
    if record["ok"] and "to_target_from_first_step_s" in record:
        extra = f", target after {fmt(record['to_target_from_first_step_s'], '.2f')}s of training"
    elif record["ok"] and "first_step_s" in record:
        extra = f", first step after {fmt(record['first_step_s'], '.2f')}s"
    status = f"{record['process_s']:.1f}s{extra}" if record["ok"] else f"FAILED ({record['error']})"
    print(f"{label} {status}", flush=True)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    adaptive = {
        "max_batch_size": args.max_batch_size,
        "local_batch_bounds": [
            args.batch_size // NUM_WORKERS // 2,
            args.max_batch_size // NUM_WORKERS,
        ],
        "lr_rule": "adascale",
        "decision_interval_s": args.decision_interval,
    }
    half = args.batch_size // NUM_WORKERS
    pinned = {
        "max_batch_size": args.batch_size,
        "local_batch_bounds": [half, half],
        "accumulation": False,
    }
    common = {
        "batch_size": args.batch_size,
        "lr": args.lr,
        "momentum": args.momentum,
        "split_seed": 0,
        "dataset": args.dataset,
    }
    ttt_job = dict(
        common,
        kind="ttt",
        epochs=args.epochs,
        target=args.target,
        lr_decay_at=args.lr_decay_at,
        max_batch_size=args.max_batch_size,
    )
    tput_job = dict(
        common,
        kind="tput",
        samples=args.tput_samples,
        hidden=args.tput_hidden,
        tput_blocks=args.tput_blocks,
    )
    sections = set(args.sections.split(","))
    source_at_start = source_fingerprint()
    ttt_reps: dict[str, list[dict[str, Any]]] = {s: [] for s in TTT_SYSTEMS}
    tput_reps: list[dict[str, Any]] = []
    resize_reps: dict[str, list[dict[str, Any]]] = {k: [] for k in RESIZE_KINDS}

    for rep in range(args.reps):  # interleaved, so drift hits every system alike
        seeded = {"seed": rep}
        if "ttt" in sections:
            for name in TTT_SYSTEMS:
                job = dict(
                    ttt_job, **seeded, adaptive=adaptive if name == "raylight_adaptive" else None
                )
                print(f"rep {rep + 1}/{args.reps}: time to target, {name} ...", end=" ", flush=True)
                ttt_reps[name].append(ttt_record(name, job, args.timeout))
                show("", ttt_reps[name][-1])
        if "tput" in sections:
            job = dict(tput_job, **seeded, adaptive=pinned)
            print(
                f"rep {rep + 1}/{args.reps}: throughput, {' / '.join(TPUT_ORDER)} ...",
                end=" ",
                flush=True,
            )
            tput_reps.append(tput_record(job, args.timeout))
            show("", tput_reps[-1])
            if tput_reps[-1]["ok"]:
                print(
                    f"  noise measurement {fmt(tput_reps[-1]['measuring_overhead_pct'], '.1f')}%, all of adaptive "
                    f"{tput_reps[-1]['overhead_pct']:.1f}%",
                    flush=True,
                )
        if "resize" in sections and rep < args.resize_reps:
            for kind in RESIZE_KINDS:
                print(
                    f"rep {rep + 1}/{args.resize_reps}: resize 1 -> 2, {kind} ...",
                    end=" ",
                    flush=True,
                )
                resize_reps[kind].append(
                    resize_record(kind, dict(common, dataset="digits", **seeded), args.timeout)
                )
                show("", resize_reps[kind][-1])

    ttt = summarize_ttt(ttt_reps)
    # The throughput model: the adaptive time-to-target runs' profiles, plus a wide run
    # when none of them saw enough layouts to leave one out.
    profiles = [
        (f"raylight_adaptive rep {i + 1}", r["engine_state"]["profile"])
        for i, r in enumerate(ttt_reps["raylight_adaptive"])
        if r["ok"] and r.get("engine_state")
    ]
    pred = prediction_error(profiles)
    forward = [
        p
        for r in ttt_reps["raylight_adaptive"]
        if r["ok"]
        for p in r.get("forward_predictions", [])
    ]
    pred["forward"] = forward_summary(forward)
    if "sweep" in sections or (not pred["held_out_predictions"] and "ttt" in sections):
        print(
            "the adaptive runs saw too few layouts to leave one out; forcing layouts "
            f"(atomic batches {', '.join(map(str, SWEEP_ATOMIC))}) ...",
            end=" ",
            flush=True,
        )
        job = dict(common, seed=0, atomic_sizes=list(SWEEP_ATOMIC), steps=args.sweep_steps)
        sweep, raw = sweep_record(job, args.timeout)
        show("", sweep)
        if sweep["ok"]:  # the forward predictions stay: the forced layouts have none
            forced = prediction_error([*profiles, ("forced layouts", raw["profile"])])
            pred = {**forced, "forward": pred["forward"]}
            sweep["runs"] = raw["runs"]
        pred["forced_layouts"] = {
            "why": "no time-to-target adaptive run saw 3 layouts with enough steps",
            "atomic_sizes": list(SWEEP_ATOMIC),
            "steps_per_layout": args.sweep_steps,
            "record": sweep,
        }

    # The adaptive trace of the median repetition (by time to target).
    adaptive_ok = [r for r in ttt_reps["raylight_adaptive"] if r["ok"] and r.get("_png")]
    adaptive_ok.sort(key=lambda r: r.get("to_target_from_first_step_s") or math.inf)
    png = adaptive_ok[len(adaptive_ok) // 2]["_png"] if adaptive_ok else None
    for records in ttt_reps.values():
        for r in records:
            r.pop("_png", None)

    tput = summarize_tput(tput_reps)
    resize = summarize_resize(resize_reps)
    results = {
        "config": {
            **common,
            "epochs": args.epochs,
            "target": args.target,
            "reps": args.reps,
            "resize_reps": min(args.resize_reps, args.reps),
            "num_workers": NUM_WORKERS,
            "torch_threads_per_worker": 1,
            "dataset": DATASETS[args.dataset],
            "resize_dataset": DATASETS["digits"],
            "resize_model": "MLP 64-128-10 float32",
            "optimizer": f"SGD lr={args.lr} momentum={args.momentum}",
            "lr_decay_at": args.lr_decay_at,
            "adaptive": adaptive,
            "pinned_adaptive": pinned,
            "tput_hidden": args.tput_hidden,
            "tput_samples": args.tput_samples,
            "tput_blocks": args.tput_blocks,
            "skip_steps": SKIP_STEPS,
            "min_profile_steps": MIN_PROFILE_STEPS,
            "timeout_s": args.timeout,
            "sections": sorted(sections),
            "backend": "gloo (CPU)",
        },
        "machine": machine_info(),
        "raylight_source": {"at_start": source_at_start, "at_end": source_fingerprint()},
        "time_to_target": ttt,
        "noise_overhead": tput,
        "resize": resize,
        "prediction": pred,
    }
    results["figures"] = figures(ttt, tput, resize, pred)
    results["_png"] = png
    return results


def main(args: argparse.Namespace) -> None:
    """Run the benchmark, print the table, write the JSON (and the trace beside it)."""
    results = run_benchmark(args)
    png = results.pop("_png")
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results: {args.out}")
    if png is not None:
        png_path = args.out.with_suffix(".png")
        png_path.write_bytes(png)
        print(f"adaptive trace: {png_path}")

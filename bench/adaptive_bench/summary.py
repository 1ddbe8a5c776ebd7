"""Summaries over the repetitions: medians per system and section (a run that missed the
target counts as slower than any that reached it), and the named figures with their
definitions and goals."""

from __future__ import annotations

import math
import statistics
from typing import Any

from adaptive_bench import PHASES, TPUT_ORDER, TPUT_SYSTEMS

GOAL_SPEEDUP = 2.0  # adaptive reaches the target at least this many times sooner
GOAL_ACC_PTS = -0.5  # ... with final accuracy no more than 0.5 points below fixed
GOAL_PRED_ERR = 0.10
GOAL_RESIZE_S = 1.0
GOAL_NOISE_PCT = 5.0


def median_of(
    records: list[dict[str, Any]], key: str, missing_as_inf: bool = False
) -> float | None:
    """Median over successful records; with ``missing_as_inf`` a missing value (target not
    reached) counts as slower than any, so the median is None when most runs missed."""
    values = []
    for r in records:
        if not r["ok"]:
            continue
        value = r.get(key)
        if value is None and missing_as_inf:
            value = math.inf
        if value is not None:
            values.append(value)
    if not values:
        return None
    med = statistics.median(values)
    return None if math.isinf(med) else med


TPUT_METRICS = ("steady_samples_per_s", "median_step_ms")
TTT_METRICS = (
    "start_to_first_step_s",
    "to_target_from_launch_s",
    "to_target_from_first_step_s",
    "epochs_to_target",
    "final_accuracy",
    "accuracy_at_epoch_budget",
    "epochs_trained",
    "best_accuracy",
    "training_s",
    "micro_steps",
    "final_global_batch",
    "process_s",
)


def summarize_ttt(reps: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out = {}
    for name, records in reps.items():
        med = {
            m: median_of(records, m, missing_as_inf=m.startswith(("to_target", "epochs_to")))
            for m in TTT_METRICS
        }
        out[name] = {
            "median": med,
            "ok_reps": sum(r["ok"] for r in records),
            "reached_target": sum(bool(r.get("reached_target")) for r in records),
            "reps": records,
        }
    return out


def summarize_tput(tput_reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The throughput pair over every run of every repetition, and the overheads per
    block (all of adaptive) and per pinned run (noise measurement)."""
    tput_runs = {
        name: [
            dict(run, ok=True)
            for r in tput_reps
            if r["ok"]
            for run in r["runs"]
            if run["system"] == name
        ]
        for name in TPUT_SYSTEMS
    }
    blocks = [v for r in tput_reps if r["ok"] for v in r["overhead_pct_per_block"]]
    measuring = [v for r in tput_reps if r["ok"] for v in r["measuring_overhead_pct_per_run"]]
    return {
        "systems": {
            name: {"median": {k: median_of(runs, k) for k in TPUT_METRICS}, "runs": len(runs)}
            for name, runs in tput_runs.items()
        },
        "order": TPUT_ORDER,
        "ok_reps": sum(r["ok"] for r in tput_reps),
        "overhead_pct_per_rep": [r.get("overhead_pct") for r in tput_reps],
        "overhead_pct_per_block": blocks,
        "median_overhead_pct": statistics.median(blocks) if blocks else None,
        "measuring_overhead_pct_per_run": measuring,
        "median_measuring_overhead_pct": statistics.median(measuring) if measuring else None,
        "reps": tput_reps,
    }


def summarize_resize(resize_reps: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        kind: {
            "median": {
                k: median_of(r, k) for k in ("first_step_s", "pause_s", "process_s", *PHASES)
            },
            "ok_reps": sum(x["ok"] for x in r),
            "reps": r,
        }
        for kind, r in resize_reps.items()
    }


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def figures(
    ttt: dict[str, Any], tput: dict[str, Any], resize: dict[str, Any], pred: dict[str, Any]
) -> dict[str, Any]:
    fixed, adapt = ttt["raylight_fixed"]["median"], ttt["raylight_adaptive"]["median"]
    speedup = ratio(fixed["to_target_from_first_step_s"], adapt["to_target_from_first_step_s"])
    speedup_launch = ratio(fixed["to_target_from_launch_s"], adapt["to_target_from_launch_s"])
    delta = None
    if fixed["final_accuracy"] is not None and adapt["final_accuracy"] is not None:
        delta = 100.0 * (adapt["final_accuracy"] - fixed["final_accuracy"])
    overhead = tput["median_measuring_overhead_pct"]
    adaptive_overhead = tput["median_overhead_pct"]
    in_place = resize["in_place"]["median"]
    cold = resize["in_place_cold"]["median"]
    from_ckpt = resize["checkpoint"]["median"]
    err = pred["forward"]["mean_relative_error"]
    unseen = pred["mean_relative_error"]
    naive = pred["forward"]["last_interval"]
    return {
        "definitions": {
            "adaptive_vs_fixed_time_to_target": "median to_target_from_first_step_s of "
            "raylight_fixed / the same of raylight_adaptive",
            "adaptive_vs_fixed_time_to_target_from_launch": "the same with to_target_from_launch_s",
            "final_accuracy_delta_pts": "100 x (median final accuracy of raylight_adaptive "
            "- that of raylight_fixed), after the epoch budget",
            "step_time_prediction_error": "mean relative error over held-out steps: at each "
            "decision of the adaptive runs, the engine's predicted seconds per optimizer step "
            "for the running plan against the mean over the steps up to the next decision "
            "(after the fit it predicted with), weighted by those steps; intervals where the "
            "plan changed, or with fewer than 5 steps, are left out",
            "step_time_prediction_error_last_interval": "the same error for a naive "
            "prediction, the mean over the interval before the decision at the same plan, "
            "on the intervals that have one (the model's error on those same intervals: "
            "prediction.forward.last_interval.model_mean_relative_error); how much the "
            "machine's speed moves from one interval to the next",
            "step_time_prediction_error_unseen_layouts": "mean relative error of "
            "leave-one-layout-out predictions (each layout a run visited, predicted by a fit "
            "to its other layouts)",
            "resize_*_s": "median first_step_s (resize decision -> rank 0's first batch at 2 "
            "workers); *_pause_s: median pause_s (stop -> that batch: training time lost); "
            "in_place: the warm spare joins (the CPU returns after it is ready); "
            "in_place_cold: warm_spare=False, a new process starts",
            "noise_overhead_pct": "median over the raylight_pinned runs of the time the "
            "noise-measuring steps added to the run: 100 x n_measuring x (mean measuring "
            "step - mean other step) / (n_steps x mean other step), steps timed on rank 0 "
            "after the first 20; measuring and other steps interleave (1 in "
            "control_interval_steps), so drift of the machine hits both alike",
            "adaptive_overhead_pct": "the whole adaptive machinery against none (noise "
            "measurement, plan agreement, the driver's polls and fits): median over blocks "
            "of 100 x (raylight_fixed mean steady samples/s / raylight_pinned mean steady "
            "samples/s - 1), each block the runs fixed, pinned, pinned, fixed in a row; each "
            "repetition one child running --tput-blocks blocks on one embedded cluster",
        },
        "adaptive_vs_fixed_time_to_target": speedup,
        "adaptive_vs_fixed_time_to_target_from_launch": speedup_launch,
        "final_accuracy_delta_pts": delta,
        "step_time_prediction_error": err,
        "step_time_prediction_error_last_interval": naive["mean_relative_error"],
        "step_time_prediction_error_unseen_layouts": unseen,
        "resize_in_place_s": in_place["first_step_s"],
        "resize_in_place_pause_s": in_place["pause_s"],
        "resize_in_place_cold_s": cold["first_step_s"],
        "resize_in_place_cold_pause_s": cold["pause_s"],
        "resize_from_checkpoint_s": from_ckpt["first_step_s"],
        "resize_from_checkpoint_pause_s": from_ckpt["pause_s"],
        "noise_overhead_pct": overhead,
        "adaptive_overhead_pct": adaptive_overhead,
        "goals": {
            "time_to_target": {
                "goal": f"adaptive_vs_fixed_time_to_target >= {GOAL_SPEEDUP} and "
                f"final_accuracy_delta_pts >= {GOAL_ACC_PTS}",
                "met": None
                if speedup is None or delta is None
                else speedup >= GOAL_SPEEDUP and delta >= GOAL_ACC_PTS,
            },
            "step_time_prediction_error": {
                "goal": f"< {GOAL_PRED_ERR}",
                "met": None if err is None else err < GOAL_PRED_ERR,
            },
            "resize_in_place_s": {
                "goal": f"< {GOAL_RESIZE_S} s",
                "met": None
                if in_place["first_step_s"] is None
                else in_place["first_step_s"] < GOAL_RESIZE_S,
            },
            "noise_overhead_pct": {
                "goal": f"< {GOAL_NOISE_PCT}%",
                "met": None if overhead is None else overhead < GOAL_NOISE_PCT,
            },
        },
    }

"""The throughput model's prediction error, from what the adaptive runs recorded: forward
predictions (each decision's predicted seconds per optimizer step against the steps up to
the next decision, in adaptive.jsonl) and leave-one-layout-out on the step profiles (in
adaptive_state.json): a fit to the other layouts predicts each layout in turn."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from adaptive_bench import MIN_PROFILE_STEPS

PLAN_KEYS = ("workers", "threads", "atomic_bsz", "accum_steps")


def forward_predictions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each decision row's predicted seconds per optimizer step for the running plan,
    against the mean measured over the steps up to the next row (held out: they came
    after the fit it predicted with), where the plan did not change in between."""
    rows = [r for r in rows if "event" not in r]
    pairs = []
    for row, later in itertools.pairwise(rows):
        if "predicted_step_time" not in row or "measured_step_time" not in later:
            continue
        if any(row.get(k) != later.get(k) for k in PLAN_KEYS):
            continue
        if later["measured_steps"] < MIN_PROFILE_STEPS:
            continue
        measured, predicted = later["measured_step_time"], row["predicted_step_time"]
        pair = {
            **{k: row[k] for k in PLAN_KEYS},
            "steps": later["measured_steps"],
            "predicted_s": predicted,
            "measured_s": measured,
            "relative_error": abs(predicted - measured) / measured,
        }
        # The naive prediction beside it: the interval before the decision, at this plan.
        if row.get("measured_steps", 0) >= MIN_PROFILE_STEPS:
            last = row["measured_step_time"]
            pair.update(last_interval_s=last, last_interval_error=abs(last - measured) / measured)
        pairs.append(pair)
    return pairs


def forward_summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-weighted mean relative errors of the forward predictions, and, over the
    intervals that have one, of the naive last-interval prediction beside the model's."""

    def weighted(rows: list[dict[str, Any]], key: str) -> float | None:
        steps = sum(p["steps"] for p in rows)
        return sum(p[key] * p["steps"] for p in rows) / steps if steps else None

    paired = [p for p in pairs if "last_interval_error" in p]
    return {
        "mean_relative_error": weighted(pairs, "relative_error"),
        "median_interval_relative_error": statistics.median(p["relative_error"] for p in pairs)
        if pairs
        else None,
        "intervals": len(pairs),
        "steps": sum(p["steps"] for p in pairs),
        "last_interval": {
            "mean_relative_error": weighted(paired, "last_interval_error"),
            "model_mean_relative_error": weighted(paired, "relative_error"),
            "intervals": len(paired),
        },
    }


def leave_one_layout_out(
    profile_rows: list[list[Any]], min_steps: int = MIN_PROFILE_STEPS
) -> dict[str, Any]:
    """For each layout with at least ``min_steps`` optimizer steps (of the most common
    thread count), fit the throughput model on the other such layouts and predict its
    mean seconds per optimizer step (accumulation micro-steps included)."""
    from raylight.adaptive.goodput import predict_step_time
    from raylight.adaptive.perf_model import fit_perf_params
    from raylight.adaptive.profile import StepProfile

    profile = StepProfile.from_json(profile_rows)
    usable = {k: s for k, s in profile.layouts.items() if s.optim_count >= min_steps}
    if not usable:
        return {"layouts": [], "usable_layouts": 0}
    counts: dict[int, int] = {}
    for _, _, _, t in usable:
        counts[t] = counts.get(t, 0) + 1
    threads = max(counts, key=lambda t: counts[t])
    layouts = sorted(k for k in usable if k[3] == threads)
    rows = []
    for held in layouts:
        others = StepProfile({k: profile.layouts[k] for k in layouts if k != held})
        obs = others.observations(threads=threads, min_steps=min_steps)
        if len(obs.num_nodes) < 2:  # one layout cannot tell fixed from per-sample costs
            continue
        params = fit_perf_params(**obs._asdict())
        stats = profile.layouts[held]
        accum = stats.accum_count / stats.optim_count
        measured = stats.step_time
        nodes, replicas, atomic, _ = held
        predicted = float(predict_step_time(params, nodes, replicas, atomic, accum))
        rows.append(
            {
                "layout": list(held),
                "optim_steps": stats.optim_count,
                "accum_steps_per_step": accum,
                "measured_s": measured,
                "predicted_s": predicted,
                "relative_error": abs(predicted - measured) / measured,
            }
        )
    return {"layouts": rows, "usable_layouts": len(layouts), "threads": threads}


def prediction_error(profiles: list[tuple[str, list[list[Any]]]]) -> dict[str, Any]:
    """Mean relative error over every held-out layout of every profile given."""
    per_run = []
    errors: list[float] = []
    for source, rows in profiles:
        lolo = leave_one_layout_out(rows)
        lolo["source"] = source
        per_run.append(lolo)
        errors.extend(r["relative_error"] for r in lolo["layouts"])
    return {
        "mean_relative_error": statistics.fmean(errors) if errors else None,
        "median_relative_error": statistics.median(errors) if errors else None,
        "held_out_predictions": len(errors),
        "runs": per_run,
    }

"""The table on stdout: time to target per system, steady throughput and the overheads,
the resizes, the step-time prediction and the named figures against their goals, then
every failed repetition with the tail of its stderr."""

from __future__ import annotations

from typing import Any

from adaptive_bench import PHASES


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: dict[str, Any]) -> None:
    cfg, ttt = results["config"], results["time_to_target"]
    print(
        f"\nTime to {100 * cfg['target']:.0f}% held-out accuracy, {cfg['dataset'].split(':')[0]}, {cfg['epochs']}-epoch budget "
        f"(medians of {cfg['reps']} reps)"
    )
    print(
        f"{'system':<18} {'ok':>4} {'hit':>4} {'start->1st s':>12} {'target from':>12} {'target from':>12} "
        f"{'epochs to':>10} {'final acc':>10} {'train s':>8} {'final':>6}"
    )
    print(
        f"{'':<18} {'':>4} {'':>4} {'':>12} {'launch s':>12} {'1st step s':>12} {'target':>10} {'%':>10} {'':>8} {'batch':>6}"
    )
    for name, s in ttt.items():
        m = s["median"]
        print(
            f"{name:<18} {s['ok_reps']}/{len(s['reps']):<2} {s['reached_target']:>4} "
            f"{fmt(m['start_to_first_step_s'], '.2f'):>12} {fmt(m['to_target_from_launch_s'], '.2f'):>12} "
            f"{fmt(m['to_target_from_first_step_s'], '.2f'):>12} {fmt(m['epochs_to_target'], '.0f'):>10} "
            f"{fmt(None if m['final_accuracy'] is None else 100 * m['final_accuracy'], '.2f'):>10} "
            f"{fmt(m['training_s'], '.2f'):>8} {fmt(m['final_global_batch'], '.0f'):>6}"
        )
    tput = results["noise_overhead"]
    print(
        f"\nSteady throughput, MLP 64-{cfg['tput_hidden']}-{cfg['tput_hidden']}-10, global batch {cfg['batch_size']}"
    )
    for name, s in tput["systems"].items():
        m = s["median"]
        print(
            f"{name:<18} {s['runs']:>2} runs {fmt(m['steady_samples_per_s'], ',.0f'):>10} samples/s "
            f"{fmt(m['median_step_ms'], '.2f'):>7} ms/step"
        )
    per_block = ", ".join(fmt(v, ".1f") for v in tput["overhead_pct_per_block"])
    print(f"adaptive overhead per block of fixed, pinned, pinned, fixed (%): {per_block}")
    per_run = ", ".join(fmt(v, ".1f") for v in tput["measuring_overhead_pct_per_run"])
    print(f"noise-measurement overhead per pinned run (%): {per_run}")
    print(
        "\nResize 1 -> 2 workers (decision -> first step at the new size; pause = stop -> first step)"
    )
    for kind, s in results["resize"].items():
        m = s["median"]
        print(
            f"{kind:<18} {s['ok_reps']}/{len(s['reps']):<2} first step {fmt(m['first_step_s'], '.2f'):>6} s  "
            f"pause {fmt(m['pause_s'], '.2f'):>6} s  "
            + "  ".join(
                f"{k.removesuffix('_s')} {fmt(m.get(k), '.2f')}"
                for k in PHASES
                if m.get(k) is not None
            )
        )
    source = results["raylight_source"]
    if source["at_start"] != source["at_end"]:
        print(
            f"\nWARNING: raylight's source changed during the benchmark ({source['at_start']} -> "
            f"{source['at_end']}); see raylight_source in each repetition"
        )
    pred = results["prediction"]
    fwd = pred["forward"]
    print(
        f"\nStep-time prediction: {fwd['intervals']} decision intervals ahead ({fwd['steps']} "
        f"held-out steps); {pred['held_out_predictions']} layouts left out "
        f"from {', '.join(r['source'] for r in pred['runs'] if r['layouts']) or 'no run'}"
        + (
            " (forced layouts added: the time-to-target runs saw too few)"
            if pred.get("forced_layouts")
            else ""
        )
    )
    naive = fwd.get("last_interval")
    if naive and naive["intervals"]:
        print(
            f"  on the {naive['intervals']} intervals that follow one at the same plan: the model "
            f"{fmt(naive['model_mean_relative_error'], '.3f')}, the last interval's mean "
            f"{fmt(naive['mean_relative_error'], '.3f')}"
        )
    fig = results["figures"]
    goals = fig["goals"]
    print("\nfigure                                       measured   goal")
    rows = [
        (
            "adaptive_vs_fixed_time_to_target",
            fig["adaptive_vs_fixed_time_to_target"],
            ".2f",
            goals["time_to_target"],
        ),
        ("  (from launch)", fig["adaptive_vs_fixed_time_to_target_from_launch"], ".2f", None),
        ("final_accuracy_delta_pts", fig["final_accuracy_delta_pts"], "+.2f", None),
        (
            "step_time_prediction_error",
            fig["step_time_prediction_error"],
            ".3f",
            goals["step_time_prediction_error"],
        ),
        ("  (naive: the last interval)", fig["step_time_prediction_error_last_interval"], ".3f", None),
        ("  (unseen layouts)", fig["step_time_prediction_error_unseen_layouts"], ".3f", None),
        ("resize_in_place_s", fig["resize_in_place_s"], ".2f", goals["resize_in_place_s"]),
        ("  pause_s", fig["resize_in_place_pause_s"], ".2f", None),
        ("resize_in_place_cold_s", fig["resize_in_place_cold_s"], ".2f", None),
        ("  pause_s", fig["resize_in_place_cold_pause_s"], ".2f", None),
        ("resize_from_checkpoint_s", fig["resize_from_checkpoint_s"], ".2f", None),
        ("  pause_s", fig["resize_from_checkpoint_pause_s"], ".2f", None),
        ("noise_overhead_pct", fig["noise_overhead_pct"], ".1f", goals["noise_overhead_pct"]),
        ("adaptive_overhead_pct (all of adaptive)", fig["adaptive_overhead_pct"], ".1f", None),
    ]
    for name, value, spec, goal in rows:
        note = (
            ""
            if goal is None
            else f"{goal['goal']}: {'met' if goal['met'] else 'NOT met' if goal['met'] is False else '-'}"
        )
        print(f"{name:<44} {fmt(value, spec):>9}   {note}")
    failed = [
        (f"time_to_target/{n}", r) for n, s in results["time_to_target"].items() for r in s["reps"]
    ]
    failed += [(f"resize/{n}", r) for n, s in results["resize"].items() for r in s["reps"]]
    failed += [("noise_overhead", r) for r in results["noise_overhead"]["reps"]]
    for section, rep in failed:
        if not rep["ok"]:
            print(f"  {section} FAILED: {rep['error']}\n    " + rep.get("stderr_tail", "")[-600:])

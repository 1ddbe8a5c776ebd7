"""PNG plots of a run's adaptive trace (matplotlib, headless).

A plot is written only when it can show a change: at least ``MIN_DECISIONS`` decisions
(batch decisions and resizes) and two rows with a plan. ``why_no_plot`` says why not,
for the driver to print instead of writing six panels of one dot each.
"""

from __future__ import annotations

import io
from typing import Any

MIN_DECISIONS = 2


def decisions_in(rows: list[dict[str, Any]]) -> int:
    """The engine's batch decisions and the resizes executed, in trace rows."""
    return sum(1 for r in rows if r.get("decision") or r.get("event") == "resized")


def why_no_plot(rows: list[dict[str, Any]]) -> str | None:
    """Why ``rows`` make no plot (a sentence for a person), or None when they do."""
    decided = decisions_in(rows)
    points = sum(1 for r in rows if "time" in r and "global_batch" in r)
    if decided >= MIN_DECISIONS and points >= 2:
        return None
    return (
        f"adaptive.png not written: the adaptive engine made {decided} decision(s) in this run "
        f"({points} trace rows with a batch plan), and a plot needs {MIN_DECISIONS} to show a "
        "change; a run longer than a few decision intervals (AdaptiveConfig.decision_interval_s, "
        "trainer.adaptive.decision_interval_s in a declarative config) makes more"
    )


def plot_adaptive(rows: list[dict[str, Any]]) -> bytes | None:
    """A PNG of workers, global batch, LR factor, noise scale, efficiency and throughput
    over time; None when ``why_no_plot`` gives a reason. Each row summarises the interval
    that ends at it (the plan that ran, the samples/s measured over it: global samples
    over wall seconds since the previous row, the definition of the progress lines'
    samples/s), so it is drawn over that interval: a batch decided at one row shows from
    the next on. Dotted lines mark batch decisions, dashed red ones resizes."""
    if why_no_plot(rows) is not None:
        return None
    points = [r for r in rows if "time" in r and "global_batch" in r]
    # The first point's interval starts at the row before it (the engine's first look):
    # drawn from there, the starting batch shows as a step, not a lone dot.
    before = [r["time"] for r in rows if "time" in r and r["time"] < points[0]["time"]]
    if before:
        points = [{**points[0], "time": before[-1]}, *points]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = points[0]["time"]
    t = [r["time"] - t0 for r in points]
    panels = [
        ("workers", "workers"),
        ("global_batch", "global batch"),
        ("lr_factor", "LR factor"),
        ("noise_scale", "noise scale"),
        ("efficiency", "efficiency"),
        ("throughput", "samples/s"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 10), sharex=True)
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(t, [r.get(key, float("nan")) for r in points], drawstyle="steps-pre", marker=".")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for r in rows:
        if "time" not in r:
            continue
        if r.get("event") == "resized":
            for ax in axes:
                ax.axvline(r["time"] - t0, color="red", alpha=0.4, linestyle="--")
        elif r.get("decision"):
            for ax in axes:
                ax.axvline(r["time"] - t0, color="grey", alpha=0.5, linestyle=":")
    axes[-1].set_xlabel("seconds")
    first, last = points[0]["global_batch"], points[-1]["global_batch"]
    fig.suptitle(f"raylight adaptive trace: {decisions_in(rows)} decisions, global batch {first} -> {last}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()

"""PNG plots of a run's adaptive trace (matplotlib, headless)."""

from __future__ import annotations

import io
from typing import Any


def plot_adaptive(rows: list[dict[str, Any]]) -> bytes | None:
    """A PNG of workers, global batch, LR factor, noise scale, efficiency and throughput
    over time; None when there is nothing to plot. Each row summarises the interval that
    ends at it (the plan that ran, the samples/s measured), so it is drawn over that
    interval: a batch decided at one row shows from that row on."""
    points = [r for r in rows if "time" in r and "global_batch" in r]
    if not points:
        return None
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
        if r.get("event") == "resized" and "time" in r:
            for ax in axes:
                ax.axvline(r["time"] - t0, color="red", alpha=0.4, linestyle="--")
    axes[-1].set_xlabel("seconds")
    fig.suptitle("raylight adaptive trace")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()

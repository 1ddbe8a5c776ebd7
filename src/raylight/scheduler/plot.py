"""Workers per job over time, as a PNG (issue 58's "seeing it"); matplotlib, no Ray.

Two sources of the same picture: the scheduler's own allocation history (``SchedulerState
.allocation_history()``: each change of the worker count a job was told; `raylight
scheduler status --plot FILE.png`), and the runs' adaptive.jsonl rows (``allocation``:
what the scheduler told the run, ``resized``: what it then ran; bench/scheduler_real.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Series = dict[str, list[tuple[float, int]]]  # job -> (time, workers) at each change


def from_history(rows: Iterable[Mapping[str, Any]]) -> Series:
    """The scheduler's ``allocation_history()`` rows as series, per job."""
    out: Series = {}
    for row in rows:
        out.setdefault(str(row["job_id"]), []).append((float(row["t"]), int(row["workers"])))
    return out


def from_traces(traces: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[Series, Series]:
    """(told, running) per run from each run's adaptive.jsonl rows: ``allocation`` rows
    are what it was told; it runs the first one's size from then, and each ``resized``
    row's ``to`` from its time; both last to the run's last timed row."""
    told: Series = {}
    running: Series = {}
    for job, rows in traces.items():
        given = [(float(r["time"]), int(r["workers"])) for r in rows if r.get("event") == "allocation"]
        told[job] = given
        ran = [(float(r["time"]), int(r["to"])) for r in rows if r.get("event") == "resized"]
        first = next(((t, w) for t, w in given if w > 0), None)
        running[job] = ([first] if first is not None else []) + ran
        ended = max((float(r["time"]) for r in rows if isinstance(r.get("time"), (int, float))), default=None)
        for series in (told[job], running[job]):  # drawn to the run's last row (its end)
            if series and ended is not None and ended > series[-1][0]:
                series.append((ended, series[-1][1]))
    return told, running


def plot_workers(path: str | Path, running: Series, *, told: Series | None = None, title: str = "workers per job", end: float | None = None) -> Path:
    """Draw each job's workers over time (steps; ``told`` dashed beside them) into ``path``.
    Times are shown from the earliest point. Refuses an empty picture (no rows)."""
    points = [t for series in (running, told or {}) for rows in series.values() for t, _ in rows]
    if not points:
        raise ValueError(f"nothing to plot into {path}: no allocation rows (did any run take part in the scheduler?)")
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    t0 = min(points)
    last = max(points) if end is None else end
    fig, ax = plt.subplots(figsize=(8, 3.5))
    try:
        for i, (job, rows) in enumerate(sorted(running.items())):
            color = f"C{i % 10}"
            _steps(ax, rows, t0, last, color=color, label=f"{job} running")
            if told and told.get(job):
                _steps(ax, told[job], t0, last, color=color, linestyle="--", alpha=0.6, label=f"{job} told")
        ax.set_xlabel("seconds")
        ax.set_ylabel("workers")
        ax.set_title(title)
        ax.legend(loc="upper right", fontsize="small")
        out = Path(path)
        fig.savefig(out, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return out


def _steps(ax: Any, rows: Sequence[tuple[float, int]], t0: float, end: float, **style: Any) -> None:
    if not rows:
        return
    xs = [t - t0 for t, _ in rows] + [end - t0]
    ys = [w for _, w in rows] + [rows[-1][1]]
    ax.step(xs, ys, where="post", **style)

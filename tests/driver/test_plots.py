"""adaptive.png: written from two decisions on, never a plot of one dot per panel."""

from __future__ import annotations

import pytest

from raylight.driver.plots import plot_adaptive, why_no_plot

pytestmark = pytest.mark.unit


def trace(decided: int, *, resized: bool = False) -> list[dict]:
    """Rows as the engine writes them: a row every 3 s, the first ``decided`` of them
    batch decisions (each doubling the batch), optionally a resize after them."""
    rows, batch = [], 64
    for i in range(4):
        row = {"time": 100.0 + 3 * i, "workers": 2, "global_batch": batch, "lr_factor": 1.0, "throughput": 1e4}
        if i < decided:
            row.update(decision="batch", reason="predicted goodput", decided_batch=2 * batch)
            batch *= 2
        rows.append(row)
    if resized:
        rows.append({"time": 112.5, "event": "resized", "from": 2, "to": 3, "reason": "goodput"})
    return rows


@pytest.mark.parametrize("decided", [0, 1])
def test_fewer_than_two_decisions_make_no_plot_and_say_why(decided):
    rows = trace(decided)
    assert plot_adaptive(rows) is None
    why = why_no_plot(rows)
    assert why is not None and f"made {decided} decision(s)" in why and "decision_interval_s" in why


def test_one_row_with_a_plan_makes_no_plot_however_many_decisions():
    rows = [r for r in trace(2) if r["time"] == 100.0] + [{"time": 104.0, "event": "resized", "from": 2, "to": 3}]
    assert plot_adaptive(rows) is None and "1 trace rows with a batch plan" in (why_no_plot(rows) or "")


@pytest.mark.parametrize("rows", [trace(2), trace(1, resized=True)], ids=["two-batch-decisions", "batch-and-resize"])
def test_two_decisions_make_a_png(rows):
    assert why_no_plot(rows) is None
    png = plot_adaptive(rows)
    assert png is not None and png.startswith(b"\x89PNG")

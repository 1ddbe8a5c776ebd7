"""Workers per job over time, drawn from real rows: the scheduler's history of a fake-jobs
run and adaptive.jsonl rows as runs write them (no Ray)."""

from __future__ import annotations

import pytest

from raylight.scheduler import plot
from raylight.scheduler.state import SchedulerState
from tests.scheduler.fake_jobs import FakeJob, simulate
from tests.scheduler.test_state import MODEL, Clock

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_scheduler_s_history_is_each_change_of_what_a_job_was_told_and_it_plots(tmp_path):
    clock = Clock()
    slots = {"n1": 2, "n2": 2}
    s = SchedulerState(lambda: {n: {"CPU": 2.0} for n in slots}, clock=clock)
    record = simulate(s, clock, [FakeJob("a", MODEL, 0.0), FakeJob("b", MODEL, 10.0)], slots, until_s=60)
    series = plot.from_history(s.allocation_history())
    told: dict[str, list[tuple[float, int]]] = {}
    for t, job, workers, _ in record.answers:
        if not told.get(job) or told[job][-1][1] != workers:
            told.setdefault(job, []).append((t, workers))
    assert series == told  # one row per change, none invented
    out = plot.plot_workers(tmp_path / "w.png", series)
    assert out.read_bytes()[:8] == PNG


def test_adaptive_jsonl_rows_give_what_each_run_was_told_and_what_it_ran(tmp_path):
    traces = {
        "a": [{"event": "allocation", "time": 100.0, "workers": 1}, {"event": "allocation", "time": 103.0, "workers": 4},
              {"event": "resized", "time": 120.0, "from": 1, "to": 4}, {"event": "step", "time": 121.0}],
        "b": [{"event": "allocation", "time": 110.0, "workers": 0, "waiting": "x"}, {"event": "allocation", "time": 125.0, "workers": 2}],
    }
    told, running = plot.from_traces(traces)
    assert told == {"a": [(100.0, 1), (103.0, 4), (121.0, 4)], "b": [(110.0, 0), (125.0, 2)]}
    assert running == {"a": [(100.0, 1), (120.0, 4), (121.0, 4)], "b": [(125.0, 2)]}  # to its last row
    assert plot.plot_workers(tmp_path / "r.png", running, told=told).read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="no allocation rows"):
        plot.plot_workers(tmp_path / "e.png", {"a": []})

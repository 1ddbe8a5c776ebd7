"""The demo's closing line (examples/declarative/demo.py), from a trace of a real demo run."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit
sys.path.insert(0, os.path.join(REPO, "examples", "declarative"))
from demo import closing_line, rates_by_batch  # noqa: E402

# A demo run's adaptive.jsonl (times from its start), the fields the line reads: rows before
# the workers' first steps, two decisions, the run's last moment (1 step, the final
# evaluation's wait in its interval) and the cost event.
ROWS = [
    {"time": 0.0, "throughput": 0.0},
    {"time": 2.0, "throughput": 0.0},
    {"time": 7.7, "global_batch": 64, "measured_steps": 12, "throughput": 1363.5, "efficiency": 1.0},
    {"time": 7.9, "global_batch": 64, "measured_steps": 27, "throughput": 471.9, "decision": "batch", "decided_batch": 394},
    {"time": 10.0, "global_batch": 394, "measured_steps": 62, "throughput": 13315.3, "decision": "batch", "decided_batch": 2048},
    {"time": 12.1, "global_batch": 2048, "measured_steps": 33, "throughput": 40152.6, "efficiency": 0.30},
    {"time": 14.2, "global_batch": 2048, "measured_steps": 60, "throughput": 57848.7, "efficiency": 0.37},
    {"time": 14.5, "event": "spare_ready", "workers": 2},
    {"time": 16.3, "global_batch": 2048, "measured_steps": 52, "throughput": 51596.4, "efficiency": 0.38},
    {"time": 16.5, "global_batch": 2048, "measured_steps": 1, "throughput": 587.3, "efficiency": 0.38},
    {"time": 23.8, "event": "cost"},
]


def test_rates_are_time_weighted_means_of_intervals_with_steps():
    rates = rates_by_batch(ROWS)
    assert rates[64] == pytest.approx(1363.5 * 5.7 / 5.9 + 471.9 * 0.2 / 5.9)
    weights = [2.1, 2.1, 2.1]  # the 1-step interval at the end is no rate; events take no interval
    assert rates[2048] == pytest.approx(sum(w * r for w, r in zip(weights, (40152.6, 57848.7, 51596.4), strict=True)) / sum(weights))


def test_the_closing_line_compares_the_starting_batch_with_the_last():
    line = closing_line(ROWS)
    speed = rates_by_batch(ROWS)[2048] / rates_by_batch(ROWS)[64]
    assert line.startswith("adaptive vs fixed batch, both measured in this run: batch 64 ")
    assert f"batch 2048 (the engine's last) {rates_by_batch(ROWS)[2048]:,.0f}: {speed:.1f}x the samples/s" in line
    assert f"efficiency 0.38, {speed * 0.38:.1f}x the training progress per second" in line
    assert "make bench-adaptive" in line


def test_a_run_that_never_left_its_batch_says_so():
    rows = [r for r in ROWS if r.get("global_batch") in (None, 64)]
    assert closing_line(rows).startswith("adaptive vs fixed batch: this run did not measure")

"""bench/scheduler_real.py's figures from hand-made job records (no Ray)."""

import pytest
from bench.scheduler_real import EXACT_TOL, figures


def _record(submit: float, finish: float, loss: float, ok: bool = True) -> dict:
    return {"ok": ok, "submit_s": submit, "finish_s": finish, "jct_s": finish - submit, "final_loss": loss,
            "workers_by_epoch": [1, 3], "waiting_allocations": 0}


def test_ratios_and_loss_comparisons_follow_the_records():
    sched = {"a": _record(0, 30, 0.5), "b": _record(15, 45, 0.2), "c": _record(30, 90, 0.1 + 2 * EXACT_TOL)}
    fixed = {"a": _record(0, 20, 0.7), "b": _record(15, 35, 0.2), "c": _record(30, 60, 0.1)}
    out = figures(sched, fixed)
    assert out["all_finished"]
    assert out["avg_jct_vs_fixed_share"] == pytest.approx((30 + 30 + 60) / (20 + 20 + 30))
    assert out["makespan_vs_fixed_share"] == 90 / 60
    loss = out["loss_vs_fixed_share"]
    # a adapts its batch: compared within the spread of the fixed-share losses (0.7 - 0.1)
    assert loss["a"]["comparison"] == "noise" and loss["a"]["within"]
    # c's batch is fixed: exact to EXACT_TOL, which 2 * EXACT_TOL misses
    assert loss["c"]["comparison"] == "exact" and not loss["c"]["within"]
    assert loss["a"]["mean_workers"] == 2.0


def test_a_failed_job_gives_no_ratios():
    sched = {"a": _record(0, 30, 0.5, ok=False)}
    assert figures(sched, {"a": _record(0, 20, 0.5)}) == {"all_finished": False}

"""A run's cost on a real local Ray cluster: Result.cost, cost.json and `raylight report`."""

from __future__ import annotations

import json
import os

import pytest

import raylight
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_two_workers_are_metered_and_priced(ray_cluster, tmp_path):
    from typer.testing import CliRunner

    from raylight.cli.main import app

    result = raylight.fit(
        loops.timed_loop, config={"seconds": 2.0}, num_workers=2, storage_path=str(tmp_path), name="priced",
        progress=False, prices={"head": 3.6},
    )
    span = result.metrics["end"] - result.metrics["start"]
    cost = result.cost
    assert cost is not None
    # The embedded cluster is one head node; both workers hold one CPU each.
    assert set(cost["node_seconds"]) == {"head"} and set(cost["worker_seconds"]) == {"CPU:1"}
    node_s = cost["node_seconds"]["head"]
    assert cost["worker_seconds"]["CPU:1"] == pytest.approx(2 * node_s, abs=0.01)
    # From the first poll (before the loop starts) to the last (after it ends).
    assert span - 0.3 <= node_s <= span + 3.0, (span, cost)
    assert cost["cost_usd"] == pytest.approx(node_s / 3600 * 3.6, rel=1e-3) and cost["unpriced"] == []
    assert cost["wall_s"] >= node_s
    with open(os.path.join(result.path, "cost.json")) as f:
        assert json.load(f) == cost

    out = CliRunner().invoke(app, ["report", result.path])
    assert out.exit_code == 0, out.output
    assert "head" in out.output and f"{cost['cost_usd']:.4f}" in out.output and "state: finished" in out.output

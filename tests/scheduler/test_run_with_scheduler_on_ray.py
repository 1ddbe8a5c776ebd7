"""One run on the session's Ray with the scheduler running: it registers, its allocation
rows go to adaptive.jsonl, and it unregisters at its end (without a scheduler it holds no
share: tests/driver/test_cluster_share.py)."""

from __future__ import annotations

import pytest

from tests.helpers import read_trace
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def _fit(tmp_path, name: str):
    import raylight

    return raylight.fit(
        loops.elastic_loop, config={"batch_size": 16, "epochs": 1, "n": 64}, num_workers=(1, 2),
        storage_path=str(tmp_path), name=name, progress=False,
    )


def test_a_run_takes_part_where_the_scheduler_runs(ray_cluster, tmp_path):
    import ray

    from raylight.scheduler import actor

    assert actor.find() is None
    handle = actor.start()
    try:
        _fit(tmp_path, "shared")
        rows = [r for r in read_trace(str(tmp_path / "shared")) if r.get("event") == "allocation"]
        assert rows and all(1 <= r["workers"] <= 2 and r["waiting"] == "" for r in rows), rows
        assert ray.get(handle.status.remote(), timeout=30)["jobs"] == []  # it unregistered at its end
    finally:
        actor.stop()

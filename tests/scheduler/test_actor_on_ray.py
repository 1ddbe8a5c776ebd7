"""The scheduler actor on a real Ray: started once by name, answering in plain data,
killed and started again with its state rebuilt from the jobs' next reports."""

import pytest

from tests.scheduler.test_state import MODEL

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_the_scheduler_is_one_named_actor_that_rebuilds_from_reports_after_a_restart(ray_cluster):
    from raylight.scheduler import actor

    ray = ray_cluster
    assert actor.find() is None
    handle = actor.start()
    try:
        assert actor.find() is not None
        again = actor.start()  # get_if_exists: the same actor, not a second one
        assert ray.get(again.ping.remote(), timeout=30)
        node = next(iter(actor.alive_nodes()))
        first = ray.get(handle.register.remote("a", min_workers=1, max_workers=2), timeout=30)
        assert first["workers"] == 1
        grown = ray.get(handle.report.remote("a", {**MODEL, "nodes": [node]}), timeout=30)
        assert grown["workers"] == 2 and set(grown["nodes"]) == {node}  # the one node's 2 CPUs
        status = ray.get(handle.status.remote(), timeout=30)
        assert [j["job_id"] for j in status["jobs"]] == ["a"]

        assert actor.stop() and actor.find() is None
        handle = actor.start()
        assert ray.get(handle.status.remote(), timeout=30)["jobs"] == []  # nothing until reports
        # a job reports its registration with its model, so a restarted scheduler learns it whole
        back = ray.get(handle.report.remote("a", {**MODEL, "nodes": [node]}, min_workers=1, max_workers=2), timeout=30)
        assert back["workers"] == 2  # the report re-registered the job
    finally:
        actor.stop()
    assert actor.find() is None

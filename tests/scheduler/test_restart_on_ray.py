"""A real run through a scheduler killed and started again mid-run (issue 58's test list):
the run keeps training on its last allocation meanwhile, the new scheduler learns it from
its next report, and it unregisters from the new one at its end. (The actor's side with
fake jobs: test_actor_on_ray.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(180)]

WAIT_S = 60.0  # each wait below: the run reports at least every REPORT_INTERVAL_S (10 s)


def _until(what: str, found: Callable[[], Any]) -> Any:
    """Poll the scheduler until ``found()`` answers something, at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if (value := found()) is not None:
            return value
        time.sleep(0.5)  # polling the actor's state, not synchronising on time
    raise AssertionError(f"{what}: not within {WAIT_S:g} s")


def test_a_real_run_trains_through_a_scheduler_restart_and_the_new_one_learns_it(ray_cluster, tmp_path):
    import ray

    import raylight
    from raylight.scheduler import actor

    def job(handle: Any) -> dict[str, Any] | None:
        jobs = ray.get(handle.status.remote(), timeout=30)["jobs"]
        return next((j for j in jobs if j["job_id"] == "through" and j["held"] > 0), None)

    stop = tmp_path / "stop"
    seen: dict[str, Any] = {}

    def restart() -> None:
        try:
            seen["before"] = _until("the run registered and reported its workers", lambda: job(first))
            assert actor.stop()
            second = actor.start()
            seen["new_actor"] = second._actor_id != first._actor_id  # a new one, nothing carried over
            seen["after"] = _until("the restarted scheduler learned the run from its report", lambda: job(second))
        except BaseException as exc:  # the test thread asserts on it
            seen["error"] = exc
        finally:
            stop.touch()  # the run ends at its next epoch

    assert actor.find() is None
    first = actor.start()
    side = threading.Thread(target=restart, daemon=True)
    try:
        side.start()
        result = raylight.fit(
            loops.elastic_loop,
            config={"batch_size": 16, "epochs": 10_000, "n": 64, "step_s": 0.01, "stop_file": str(stop)},
            num_workers=(1, 2), storage_path=str(tmp_path), name="through", progress=False,
        )
        side.join(WAIT_S)
        assert "error" not in seen, seen.get("error")
        assert seen["new_actor"]  # the run's next report registered it with the new scheduler:
        assert seen["after"]["workers"] >= 1 and seen["after"]["min_workers"] == 1 and seen["after"]["max_workers"] == 2
        epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
        assert 0 < len(epochs) < 10_000  # it trained through, and ended at the stop file
        handle = actor.find()
        assert handle is not None and ray.get(handle.status.remote(), timeout=30)["jobs"] == []  # unregistered there
    finally:
        stop.touch()
        actor.stop()

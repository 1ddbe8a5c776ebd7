"""The run's calls to the cluster's raylight scheduler actor, each with a timeout.

``find_link()`` is the cheap check a run makes at its start (one GCS lookup of the
scheduler's name): None where no scheduler runs, and the run trains exactly as it would
without one. ``RayLink`` answers None for a call the scheduler did not answer within
``CALL_TIMEOUT_S``; after the scheduler died, each call first looks its name up again
(a scheduler started again learns the run from its next report) and answers None while
none runs: the run keeps its last allocation (``driver/controller/cluster_share.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray
import ray.exceptions

from raylight.scheduler import actor

log = logging.getLogger("raylight")

# Each call to the scheduler: it answers in milliseconds; the controller waits no longer.
CALL_TIMEOUT_S = 5.0
# Set to "start" (by `raylight submit --scheduler`): a run that finds no scheduler starts one.
START_ENV = "RAYLIGHT_SCHEDULER"


# While the controller is busy (a start or a resize can take minutes on a loaded
# cluster), a thread repeats the run's last report this often, so the scheduler does not
# drop it as silent (STALE_AFTER_S, 60 s) and give its slots away.
KEEPALIVE_S = 10.0


class RayLink:
    """``SchedulerLink`` over the actor ``handle``; from registration to unregistration a
    daemon thread keeps the run known (``KEEPALIVE_S``)."""

    def __init__(self, handle: Any, *, timeout_s: float = CALL_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S) -> None:
        self.handle = handle
        self.timeout_s = timeout_s
        self.keepalive_s = keepalive_s
        self.gone = False
        self._warned_timeout = False
        self._lock = threading.Lock()  # one call at a time: the controller's or the keepalive's
        self._last: tuple[str, dict[str, Any], dict[str, Any]] | None = None  # the last report's arguments
        self._called = time.monotonic()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _keepalive(self) -> None:
        while not self._done.wait(self.keepalive_s / 2):
            if self._last is not None and time.monotonic() - self._called >= self.keepalive_s:
                job_id, model, fields = self._last
                self._call("report", job_id, model, **fields)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._called = time.monotonic()
            return self._call_now(method, *args, **kwargs)

    def _call_now(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.gone:  # a scheduler started again answers under the same name
            handle = actor.find()
            if handle is None:
                return None
            self.handle, self.gone = handle, False
        try:
            return ray.get(getattr(self.handle, method).remote(*args, **kwargs), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            if not self._warned_timeout:
                self._warned_timeout = True
                log.warning(
                    "the raylight scheduler did not answer %s within raylight.driver.scheduler_link.CALL_TIMEOUT_S=%g s; "
                    "the run keeps its last allocation and asks again later", method, self.timeout_s,
                )
            return None
        except ray.exceptions.RayActorError as exc:
            self.gone = True
            log.warning("the raylight scheduler is gone (%s); the run keeps its last allocation", type(exc).__name__)
            self.handle = None
            return None
        except ray.exceptions.RayTaskError as exc:  # it refused what the run sent: a bug here, not the user's
            log.warning("the raylight scheduler refused the run's %s: %s", method, exc)
            return None

    def register(self, job_id: str, **fields: Any) -> dict[str, Any] | None:
        self._last = (job_id, {}, dict(fields))
        if self._thread is None:
            self._thread = threading.Thread(target=self._keepalive, name="raylight-scheduler-keepalive", daemon=True)
            self._thread.start()
        return self._call("register", job_id, **fields)

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any] | None:
        self._last = (job_id, dict(model), dict(fields))
        return self._call("report", job_id, model, **fields)

    def unregister(self, job_id: str) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)
        try:
            self._call("unregister", job_id)
        except Exception as exc:  # at the end of a run Ray may be going too: the scheduler drops it as silent
            log.debug("could not unregister from the raylight scheduler: %s: %s", type(exc).__name__, exc)


def find_link() -> RayLink | None:
    """The link to the scheduler on the connected cluster, or None where none runs (or
    the run trains inside a placement group: a Tune trial's bundles are Tune's to give).
    With ``START_ENV=start`` in the environment, a scheduler is started where none runs."""
    from ray.util import get_current_placement_group

    if get_current_placement_group() is not None:
        return None
    handle = actor.find()
    if handle is None and os.environ.get(START_ENV) == "start":
        try:
            handle = actor.start()
        except TimeoutError as exc:  # the run trains as it would without one
            log.warning("%s=start: %s; the run goes on without the scheduler", START_ENV, exc)
            return None
    return None if handle is None else RayLink(handle)

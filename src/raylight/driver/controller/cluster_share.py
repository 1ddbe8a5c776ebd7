"""ClusterShare: a run's part in the cluster's goodput scheduler (issue 58), with no Ray.

A run on a cluster where the raylight scheduler runs (``raylight scheduler start``) holds
one of these; without a scheduler it holds none and behaves exactly as before. The flow::

    INITIALIZING  admit(): register (fixed or adaptive, min/max workers, weight, resources);
                  a fixed run waits here until the scheduler gives it its size
    RUNNING       the scaling policy offers its goodput model at each adaptive decision
                  (offer), and reads the allocation as its bounds (workers)
                  the controller sends it (tick): at once after an offer, else every
                  REPORT_INTERVAL_S so the scheduler does not drop the run as silent
    the end       close(): unregister (finished, failed, or interrupted)

Each call goes through a ``link`` (``raylight.driver.scheduler_link.RayLink``: the actor,
with a timeout on every call) whose answer is the allocation as plain data, or None when
the scheduler did not answer: the run then keeps its last allocation (and a run that had
none starts as it would without a scheduler). Every change of allocation is an
``allocation`` row in the run's adaptive.jsonl (``event``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from raylight.base.clock import wall

# A run reports at least this often, well inside the scheduler's STALE_AFTER_S (60 s).
REPORT_INTERVAL_S = 10.0
# A fixed run waiting for its size asks again this often.
ADMIT_POLL_S = 2.0


class SchedulerLink(Protocol):
    """The scheduler's three calls; each answers the allocation, or None: no answer."""

    def register(self, job_id: str, **fields: Any) -> dict[str, Any] | None: ...

    def report(self, job_id: str, model: dict[str, Any], **fields: Any) -> dict[str, Any] | None: ...

    def unregister(self, job_id: str) -> None: ...


@dataclass(frozen=True)
class Share:
    """The scheduler's allocation as the run sees it (``workers`` 0: it waits, ``waiting`` says why)."""

    workers: int
    nodes: tuple[str, ...] = ()
    speedup: float = 0.0
    waiting: str = ""

    @classmethod
    def of(cls, answer: dict[str, Any]) -> Share:
        return cls(
            int(answer.get("workers", 0)), tuple(str(n) for n in answer.get("nodes", [])),
            float(answer.get("speedup", 0.0)), str(answer.get("waiting", "")),
        )


def goodput_model(engine: Any, *, num_workers: int, threads: int) -> dict[str, Any]:
    """What the scheduler needs of an adaptive engine (``raylight.adaptive.engine``) as
    plain data: the throughput model at ``threads`` threads per worker, the gradient
    noise, the batch bounds at ``num_workers``, the measured resize cost; ``{}`` until
    the throughput model is fitted (the scheduler keeps the run's size until then)."""
    fn = engine.goodput_fn(threads)
    if fn is None:
        return {}
    batch = engine.batch_policy(num_workers)
    return {
        "perf": [float(x) for x in fn.perf_params], "grad": [float(x) for x in fn.grad_params],
        "init_batch_size": int(fn.init_batch_size), "max_batch_size": int(batch.max_batch_size),
        "atomic_bsz_range": [int(b) for b in batch.local_bsz_bounds], "accumulation": bool(batch.accumulation),
        "resize_cost_s": float(engine.restart_cost_s),
    }


class ClusterShare:
    """One run's registration with the scheduler and its latest allocation."""

    def __init__(
        self,
        link: SchedulerLink,
        job_id: str,
        *,
        fixed: bool,
        min_workers: int,
        max_workers: int,
        resources: dict[str, float],
        weight: float = 1.0,
        report_interval_s: float = REPORT_INTERVAL_S,
        event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.link = link
        self.job_id = job_id
        self.fields: dict[str, Any] = {
            "fixed": fixed, "min_workers": min_workers, "max_workers": max_workers,
            "weight": weight, "resources": dict(resources),
        }
        self.report_interval_s = report_interval_s
        self.event = event or (lambda row: None)
        self.share: Share | None = None  # the last allocation answered
        self.history: list[dict[str, Any]] = []
        self._model: dict[str, Any] = {}
        self._pending = False
        self._registered = False
        self._last_report: float | None = None
        self._asked: tuple[float, int] | None = None  # (when, workers) of a change not reached yet
        self.resize_costs: list[float] = []  # seconds from each new allocation to running at it

    @property
    def fixed(self) -> bool:
        return bool(self.fields["fixed"])

    @property
    def workers(self) -> int | None:
        """The allocation's worker count, None while the scheduler gave none (or never answered)."""
        return self.share.workers if self.share is not None and self.share.workers > 0 else None

    # -- the calls ----------------------------------------------------------------------
    def admit(self, now: float, capacity: Callable[[], int]) -> str:
        """Register (again, while waiting); the reason to wait, or "" to start now. A run
        the scheduler does not answer starts: it never waits on a scheduler that is gone.
        Admitted, it still waits until its minimum fits the cluster (``capacity()``: the
        workers it could run now), while the runs the scheduler shrank give slots back."""
        if not self._registered:
            answer = self.link.register(self.job_id, **self.fields)
            self._registered = answer is not None
        else:
            answer = self.link.report(self.job_id, self._with_nodes([]), **self.fields)
        self._last_report = now
        self._take(answer, now)
        need = self.fields["min_workers"]
        if answer is None or self.share is None:
            return ""
        if self.share.workers < need:
            return self.share.waiting or f"waiting for the raylight scheduler to give {need} worker(s)"
        free = capacity()
        if free < need:
            return f"waiting for {need} worker(s)' resources the raylight scheduler gave this run: {free} free, other runs are shrinking to their share"
        return ""

    def offer(self, model: dict[str, Any]) -> None:
        """The run's goodput model changed: sent at the next tick."""
        self._model, self._pending = dict(model), True

    def tick(self, now: float, nodes: Sequence[str]) -> None:
        """Report the model and where the workers run, after an offer or every report_interval_s.
        The first tick at a new allocation's size measures what the change cost the run:
        the seconds from the scheduler's answer to training at that size (the controller
        ticks only once a resize's first step is in)."""
        if self._asked is not None and len(nodes) == self._asked[1]:
            self.resize_costs.append(now - self._asked[0])
            self._asked = None
        due = self._last_report is None or now - self._last_report >= self.report_interval_s
        if not (self._pending or due):
            return
        self._pending, self._last_report = False, now
        self._take(self.link.report(self.job_id, self._with_nodes(nodes), **self.fields), now, len(nodes))

    def close(self) -> None:
        self.link.unregister(self.job_id)

    # -- answers ------------------------------------------------------------------------
    def _with_nodes(self, nodes: Sequence[str]) -> dict[str, Any]:
        model = {**self._model, "nodes": list(nodes)}
        if self.resize_costs and self._model:
            # What a re-allocation really cost this run (the scheduler's answer to its
            # first step at the new size, median), where it exceeds the engine's own
            # measure (its decision to that step): the policy charges it per change.
            measured = sorted(self.resize_costs)[len(self.resize_costs) // 2]
            model["resize_cost_s"] = max(float(model.get("resize_cost_s", 0.0)), measured)
        return model

    def _take(self, answer: dict[str, Any] | None, now: float, running: int | None = None) -> None:
        if answer is None:
            return  # no answer: the last allocation stands
        share, last = Share.of(answer), self.share
        if share.workers > 0 and running and share.workers != running and (last is None or share.workers != last.workers):
            self._asked = (now, share.workers)
        # A row when the allocation changes (its speedup alone changes at every report).
        if last is None or (share.workers, share.nodes, share.waiting) != (last.workers, last.nodes, last.waiting):
            row = {"event": "allocation", "time": wall(), "workers": share.workers, "nodes": list(share.nodes),
                   "speedup": share.speedup, "waiting": share.waiting}
            self.history.append(row)
            self.event(row)
        self.share = share

"""GoodputScalingPolicy: every scaling decision of an adaptive or elastic run.

Why did this run resize, or change its batch? It is decided here. Each poll, the policy
feeds rank 0's measurements to the adaptive engine (``raylight.adaptive.engine``, pure
goodput math). Every ``decision_interval_s`` it asks the engine for a better batch plan
for the running layout (``SetPlan``) and writes a trace row of what the engine predicts.
In an elastic run, every ``resize_interval_s`` (after a resize, counted from the first
step at the new size) it asks the engine for the best layout among those the cluster can
run now, within (min, max) workers (``Resize``), and, with
``autoscale``, asks the autoscaler for the workers the goodput model wants beyond what
fits (``RequestResources``). It owns the run's one (min, max) clamp, its start size,
the threads per worker of each size, and the plan for a new size. The controller
executes what it returns; nothing here touches Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raylight.adaptive.engine import AdaptiveEngine
from raylight.adaptive.plan import BatchPlan
from raylight.adaptive.policy import Layout
from raylight.base.clock import monotonic
from raylight.driver.controller.cluster_share import ClusterShare, goodput_model
from raylight.driver.controller.decisions import RequestResources, Resize, ScalingDecision, SetPlan
from raylight.driver.controller.policies import ScalingView
from raylight.worker.protocol import GroupPoll


@dataclass(frozen=True)
class ScalingSettings:
    """What the policy needs of the run's config (built by ``trainer.build_scaling_policy``)."""

    elastic: bool
    min_workers: int
    max_workers: int
    threads_per_worker: int  # torch threads of each worker when the size is fixed
    thread_budget: float | None  # elastic: CPUs the largest size reserves, shared by the running workers
    decision_interval_s: float
    resize_interval_s: float
    autoscale: bool
    resize_in_place: bool


class GoodputScalingPolicy:
    """Implements ``ScalingPolicy`` with the adaptive engine (see the module docstring)."""

    def __init__(
        self,
        engine: AdaptiveEngine,
        settings: ScalingSettings,
        *,
        trace: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = monotonic,
        share: ClusterShare | None = None,
    ) -> None:
        self.engine = engine
        self.share = share  # where the cluster's scheduler runs: its allocation bounds the size
        self.settings = settings
        self._trace = trace or (lambda row: None)
        self._clock = clock
        self._last_batch = clock()
        self._last_layout = clock()
        self._plan_workers = 1  # the size the engine's current plan was made for
        self._requested = 0  # workers asked of the autoscaler (0: nothing asked)

    # -- sizes ------------------------------------------------------------------------
    def clamp(self, num_workers: int) -> int:
        """The one (min, max) bound of the run's size."""
        s = self.settings
        return max(s.min_workers, min(s.max_workers, num_workers))

    def start_size(self, capacity: Callable[[], int]) -> int:
        """An elastic run starts with as many as fit now, within (min, max) and the
        scheduler's allocation where one runs."""
        if not self.settings.elastic:
            return self.settings.max_workers
        allocated = self.share.workers if self.share is not None else None
        return self.clamp(capacity() if allocated is None else min(capacity(), allocated))

    def restart_size(self, num_workers: int) -> int:
        return self.clamp(num_workers) if self.settings.elastic else self.settings.max_workers

    def fewest(self, num_workers: int) -> int:
        """An elastic run starts with what the cluster places now, down to min."""
        return min(self.settings.min_workers, num_workers) if self.settings.elastic else num_workers

    def threads(self, num_workers: int) -> int:
        """Fixed when set or when the size is; in an elastic run, the CPUs its largest
        size reserves, shared by the workers running."""
        budget = self.settings.thread_budget
        if budget is None:
            return self.settings.threads_per_worker
        return max(1, int(budget // num_workers))

    def plan(self, num_workers: int) -> BatchPlan | None:
        return self.engine.plan_for(num_workers, old_workers=self._plan_workers, threads=self.threads(num_workers))

    def started(self, num_workers: int) -> None:
        self._plan_workers = num_workers

    # -- each poll --------------------------------------------------------------------
    def observe(self, poll: GroupPoll) -> None:
        for p in poll.polls:
            if p.rank == 0 and p.adaptive is not None:
                self.engine.observe(p.adaptive)

    def decide(self, view: ScalingView) -> list[ScalingDecision]:
        s, engine = self.settings, self.engine
        decisions: list[ScalingDecision] = []
        if view.now - self._last_batch >= s.decision_interval_s:
            self._last_batch = view.now
            plan = engine.decide_batch(num_workers=view.num_workers, threads=view.threads)
            row = engine.trace_row(num_workers=view.num_workers, threads=view.threads)
            if plan is not None:
                decisions.append(SetPlan(plan, engine.last_batch_reason))
                # The row's global_batch is the plan that ran up to now; the decided one
                # runs from here on (`raylight report` shows the change on this row).
                row.update(decision="batch", reason=engine.last_batch_reason, decided_batch=plan.global_batch(view.num_workers))
            self._trace(row)
            if self.share is not None:
                self.share.offer(goodput_model(engine, num_workers=view.num_workers, threads=view.threads))
        if s.elastic and view.now - self._last_layout >= s.resize_interval_s:
            self._last_layout = view.now
            if self.share is not None and self.share.workers is not None:
                return [*decisions, *self._follow_share(view, self.share.workers)]
            capacity = min(view.capacity(), s.max_workers)
            current = Layout(view.num_workers, view.threads)
            layout = engine.decide_layout(current=current, candidates=self._layouts(capacity))
            if s.autoscale:
                # What the goodput model says is worth running, among every size up to max
                # (not only what fits): the request is the whole run's, so a smaller one
                # gives the rest back to the autoscaler.
                wanted = engine.decide_layout(current=current, candidates=self._layouts(s.max_workers))
                want = current.num_workers if wanted is None else wanted.layout.num_workers
                if want != self._requested and (want > capacity or self._requested > 0):
                    self._requested = want
                    why = wanted.reason if wanted is not None else f"keep {want}"
                    decisions.append(RequestResources(want, f"{why} ({capacity} fit now)"))
            if layout is not None and layout.layout != current:
                decisions.append(Resize(self.clamp(layout.layout.num_workers), layout.reason, s.resize_in_place))
        return decisions

    def _follow_share(self, view: ScalingView, allocated: int) -> list[ScalingDecision]:
        """The scheduler's allocation is the run's size (within its own bounds): it chose
        it from this run's goodput model and the other runs'. Growing waits for the
        slots to be free (the others shrink to their share at their next decision)."""
        want = allocated if allocated <= view.num_workers else min(allocated, view.capacity())
        target = self.clamp(want)
        if target == view.num_workers:
            return []
        why = f"the raylight scheduler's allocation: {allocated} worker(s)"
        return [Resize(target, why if target == allocated else f"{why}, {target} fit now", self.settings.resize_in_place)]

    def _layouts(self, up_to: int) -> list[Layout]:
        """The layouts the run may take with at most ``up_to`` workers: every size within
        (min, max), each with its thread count."""
        return [Layout(k, self.threads(k)) for k in range(self.settings.min_workers, min(up_to, self.settings.max_workers) + 1)]

    def on_lost(self, num_workers: int, lost: int) -> Resize | None:
        if not self.settings.elastic:
            return None
        return Resize(self.clamp(max(num_workers - lost, 1)), f"lost {lost} worker(s)", self.settings.resize_in_place)

    def on_notice(self, num_workers: int, leaving: frozenset[int]) -> Resize | None:
        """Workers on nodes given notice stop at a step boundary where every worker
        checkpoints (a snapshot). An elastic run goes on in place without them; a run of
        fixed size (or one with no worker left) restarts from that snapshot at its size,
        on the nodes that stay."""
        s = self.settings
        remaining = num_workers - len(leaving)
        why = f"preemption notice for rank(s) {sorted(leaving)}"
        if s.elastic and s.resize_in_place and remaining >= 1:
            return Resize(self.clamp(remaining), why, True, leaving, snapshot=True)
        return Resize(self.restart_size(num_workers), why, True, frozenset(range(num_workers)), snapshot=True)

    def record_restart(self, seconds: float) -> None:
        self.engine.record_restart(seconds)
        # A new size gets a whole interval from its first step before the next look: a
        # resize slower than the interval would otherwise be undone (or redone) at once.
        self._last_layout = self._clock()

    def finish(self, view: ScalingView) -> None:
        self._trace(self.engine.trace_row(num_workers=view.num_workers, threads=view.threads))

    def display_fields(self, num_workers: int, threads: int) -> dict[str, Any]:
        return self.engine.display_fields(num_workers, threads)

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()

"""RunTelemetry: what the controller observes of a run, for people and the trace.

It owns the run's sample rate (global samples per second), the rows of
``adaptive.jsonl`` (each stamped with the samples/s since the previous row), the timing of
each resize (from the decision to the first step after it, with its phases), and the
progress display's updates, and the run's cost meter (where the workers ran, for how
long). It decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raylight.adaptive.profile import SampleRate
from raylight.base.clock import monotonic
from raylight.base.cost import CostMeter
from raylight.worker.protocol import GroupPoll

if TYPE_CHECKING:
    from raylight.driver.controller.controller import Controller


class RunTelemetry:
    """``trace``: where trace rows go (None: no trace); ``on_poll``: called after each
    poll (the progress display)."""

    def __init__(
        self,
        *,
        trace: Callable[[dict[str, Any]], None] | None = None,
        on_poll: Callable[[GroupPoll, Controller], None] | None = None,
        clock: Callable[[], float] = monotonic,
        cost: CostMeter | None = None,
    ) -> None:
        self._trace = trace
        self.on_poll = on_poll
        self.clock = clock
        self.rate = SampleRate()
        self.throughput = 0.0  # samples/s over the rate's window
        self.resizes: list[dict[str, Any]] = []  # each resize, once its first step ran
        self.watch: dict[str, Any] | None = None  # a resize waiting for its first step
        self._row_mark: tuple[float, int] | None = None  # (time, samples) at the last row
        self._row_rate = 0.0  # the samples/s the last row gave
        self._spare_ready = False
        self.cost = cost or CostMeter(clock())  # worker- and node-seconds, poll to poll

    # -- the trace ----------------------------------------------------------------------
    def trace_row(self, row: dict[str, Any]) -> None:
        """Write a trace row of the adaptive engine, with the samples/s since the
        previous one (``SampleRate.since``, the progress lines' figure; from the first
        samples for the first row): the same interval as the row's measured step time;
        the window's rate lags a batch change by its whole width. Rows of one poll share
        the interval of the first."""
        if self._trace is None:
            return
        mark, now = self._row_mark, self.rate.mark()
        if mark is not None and now is not None and now[0] <= mark[0]:
            rate = self._row_rate
        else:
            rate = self.rate.since(mark)
            self._row_mark, self._row_rate = now, rate
        self._trace({**row, "throughput": rate})

    def event(self, row: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace(row)

    # -- each poll ----------------------------------------------------------------------
    def observe(self, poll: GroupPoll, num_workers: int) -> float | None:
        """Take this poll's progress in; returns the seconds from decision to first step
        of a resize whose first step this poll shows, else None."""
        if poll.spare_ready != self._spare_ready:
            self._spare_ready = poll.spare_ready
            if poll.spare_ready:
                self.event({"event": "spare_ready", "workers": num_workers})
        now = self.clock()
        self.cost.observe(now, poll.placement)
        self.throughput = self.rate.update(sum(p.progress.samples for p in poll.polls), now)
        if self.watch is None:
            return None
        rank0 = next((p for p in poll.polls if p.rank == 0), None)
        if rank0 is None or rank0.progress.batches_since_start == 0:
            return None
        watch, self.watch = self.watch, None
        # Timed from rank 0's own stamp of its first batch where it has one (wall clocks:
        # the driver's poll interval does not count); else from this poll.
        first = rank0.progress.first_batch_wall
        decided_wall = watch.pop("decided_wall", None)
        stopped_wall = watch.pop("stopped_wall", None)
        stopped_at = watch.pop("stopped_at", watch["decided_at"])
        if first is not None and decided_wall is not None:
            watch["first_step_s"] = max(0.0, first - decided_wall)
            watch["pause_s"] = max(0.0, first - (stopped_wall or decided_wall))
        else:
            watch["first_step_s"] = now - watch["decided_at"]
            watch["pause_s"] = now - stopped_at
        self.resizes.append(watch)
        self.event({"event": "resized", **watch})
        return float(watch["first_step_s"])

    def resized(self, watch: dict[str, Any]) -> None:
        """A resize was executed; its timing completes at its first step."""
        self.watch = watch

    @property
    def awaiting_first_step(self) -> bool:
        return self.watch is not None

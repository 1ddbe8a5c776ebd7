"""StepProfile: observed step times per layout, the input of fit_perf_params.

Workers send increments (sums and counts per layout); the driver merges them. Sums keep
the profile small however long the run, like AdaptDL's profile. Beside the totals, each
layout keeps recency-weighted sums: with ``memory_steps`` set, a step's weight decays by
exp(-1/memory_steps) with each later optimizer step of its layout, so the means the model
is fitted to follow a machine whose speed drifts (other work, thermal limits, a noisy
neighbour) instead of averaging over the whole run. A layout that is not running keeps
its weights: nothing newer says it changed.

Because a layout that stops running keeps its recent mean, a stall (the machine slows
several times over for a few seconds) must not become that mean: the engine would leave
the layout and never learn that it recovered. So, with a memory, an increment whose mean
step time exceeds STALL_FACTOR times the layout's recent mean enters the recent sums as
STALL_FACTOR times that mean; the totals keep what was measured. A lasting slowdown is
still followed: each increment may double the reference it is compared with.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

Layout = tuple[int, int, int, int]  # (num_nodes, num_replicas, atomic_bsz, threads)

STALL_FACTOR = 2.0  # an increment counts as at most this many times the recent mean
STALL_MIN_STEPS = 5.0  # once the layout's recent sums weigh this many optimizer steps


@dataclass
class LayoutStats:
    accum_count: int = 0
    accum_time: float = 0.0  # sum of non-synchronising micro-step times
    optim_count: int = 0
    optim_time: float = 0.0  # sum of synchronising micro-step times
    # Recency-weighted sums (equal to the totals when nothing decays).
    accum_weight: float = 0.0
    accum_recent: float = 0.0
    optim_weight: float = 0.0
    optim_recent: float = 0.0

    def merge(self, other: LayoutStats, decay: float = 1.0) -> None:
        """Add ``other``'s steps, after decaying this layout's recent sums by ``decay``."""
        self.accum_count += other.accum_count
        self.accum_time += other.accum_time
        self.optim_count += other.optim_count
        self.optim_time += other.optim_time
        self.accum_weight = decay * self.accum_weight + other.accum_weight
        self.accum_recent = decay * self.accum_recent + other.accum_recent
        self.optim_weight = decay * self.optim_weight + other.optim_weight
        self.optim_recent = decay * self.optim_recent + other.optim_recent

    @property
    def step_time(self) -> float:
        """Mean seconds per optimizer step over every step, accumulation micro-steps included."""
        return (self.optim_time + self.accum_time) / self.optim_count

    @property
    def recent_step_time(self) -> float:
        """The same, recency-weighted."""
        return (self.optim_recent + self.accum_recent) / self.optim_weight

    def stall_clipped(self, inc: LayoutStats) -> LayoutStats:
        """``inc`` with its recent times scaled so that its mean time per optimizer step
        (accumulation micro-steps included) is at most STALL_FACTOR times this layout's
        recent mean; unchanged below that, or before STALL_MIN_STEPS."""
        if self.optim_weight < STALL_MIN_STEPS or inc.optim_weight <= 0:
            return inc
        limit = STALL_FACTOR * self.recent_step_time
        mean = inc.recent_step_time
        if mean <= limit:
            return inc
        scale = limit / mean
        return replace(inc, accum_recent=inc.accum_recent * scale, optim_recent=inc.optim_recent * scale)


class Observations(NamedTuple):
    """Recency-weighted mean step times per layout, named as fit_perf_params takes them:
    ``fit_perf_params(**obs._asdict())``."""

    num_nodes: np.ndarray
    num_replicas: np.ndarray
    atomic_bsz: np.ndarray
    accum_step_time: np.ndarray
    optim_step_time: np.ndarray
    weights: np.ndarray  # each mean's (decayed) number of optimizer steps

    @property
    def times(self) -> tuple[np.ndarray, ...]:
        """The five arrays fit_error and the unweighted fit take."""
        return tuple(self[:5])


@dataclass
class StepProfile:
    layouts: dict[Layout, LayoutStats] = field(default_factory=dict)
    memory_steps: float | None = None  # None: every step weighs alike

    def add(self, layout: Layout, *, accum_time: float | None = None, optim_time: float | None = None) -> None:
        """One micro-step (a worker's hot path: plain increments)."""
        s = self.layouts.setdefault(layout, LayoutStats())
        if accum_time is not None:
            s.accum_count += 1
            s.accum_time += accum_time
            s.accum_weight += 1.0
            s.accum_recent += accum_time
        if optim_time is not None:
            if self.memory_steps is not None:  # one optimizer step later: older ones decay
                decay = math.exp(-1.0 / self.memory_steps)
                s.accum_weight, s.accum_recent = decay * s.accum_weight, decay * s.accum_recent
                s.optim_weight, s.optim_recent = decay * s.optim_weight, decay * s.optim_recent
            s.optim_count += 1
            s.optim_time += optim_time
            s.optim_weight += 1.0
            s.optim_recent += optim_time

    def merge(self, other: StepProfile) -> None:
        """Add an increment; with ``memory_steps``, a layout's earlier steps decay by one
        factor per optimizer step the increment brings (increments are short: a poll's
        worth of steps weigh alike among themselves), and a stalled increment counts as
        STALL_FACTOR times the layout's recent mean."""
        for layout, stats in other.layouts.items():
            mine = self.layouts.setdefault(layout, LayoutStats())
            if self.memory_steps is None:
                mine.merge(stats)
            else:
                decay = math.exp(-stats.optim_count / self.memory_steps)
                mine.merge(mine.stall_clipped(stats), decay)

    def observations(self, *, threads: int | None = None, min_steps: int = 1) -> Observations:
        """Recency-weighted mean times per layout with at least ``min_steps`` optimizer
        steps, for one thread count (NaN accumulation time where a layout had none)."""
        rows = [
            (
                n, k, m,
                s.accum_recent / s.accum_weight if s.accum_weight > 0 else np.nan,
                s.optim_recent / s.optim_weight,
                s.optim_weight,
            )
            for (n, k, m, t), s in sorted(self.layouts.items())
            if s.optim_count >= min_steps and s.optim_weight > 0 and (threads is None or t == threads)
        ]
        if not rows:
            return Observations(*(np.array([]) for _ in range(6)))
        return Observations(*(np.array(col, dtype=float) for col in zip(*rows, strict=True)))

    def thread_counts(self) -> list[int]:
        return sorted({t for (_, _, _, t) in self.layouts})

    def to_json(self) -> list[list[Any]]:
        """One row per layout: the layout, the totals, then the recent sums where they
        differ from the totals (a worker's increment is the first eight columns only)."""
        rows = []
        for layout, s in self.layouts.items():
            row = [*layout, s.accum_count, s.accum_time, s.optim_count, s.optim_time]
            recent = [s.accum_weight, s.accum_recent, s.optim_weight, s.optim_recent]
            if recent != [s.accum_count, s.accum_time, s.optim_count, s.optim_time]:
                row += recent
            rows.append(row)
        return rows

    @classmethod
    def from_json(cls, rows: list[list[Any]], memory_steps: float | None = None) -> StepProfile:
        prof = cls(memory_steps=memory_steps)
        for row in rows:
            n, k, m, t, ac, at, oc, ot = row[:8]
            recent = row[8:] or [ac, at, oc, ot]
            prof.layouts[(int(n), int(k), int(m), int(t))] = LayoutStats(
                int(ac), float(at), int(oc), float(ot), *(float(v) for v in recent)
            )
        return prof


class SampleRate:
    """Global samples/s over a sliding window of polls, robust to restarts.

    ``since(mark)`` is the figure people read, in the progress lines (each epoch's) and in
    adaptive.jsonl and its plot (each row's interval): the samples counted from a
    ``mark()`` to the last update over the wall seconds between them, training only (the
    time before the first samples, worker start-up, is not counted). The window's rate,
    what ``update`` returns, lags a change by its whole width: a live gauge only."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()
        self._total = 0
        self._last_sum = 0
        self._first: tuple[float, int] | None = None  # the first update that counted samples

    def update(self, samples_now: int, now: float) -> float:
        delta = samples_now - self._last_sum
        if delta < 0:  # counters restarted with a new worker group
            delta = samples_now
        self._last_sum = samples_now
        self._total += delta
        if self._first is None and self._total > 0:
            self._first = (now, self._total)
        self._points.append((now, self._total))
        while len(self._points) > 2 and now - self._points[0][0] > self.window_s:
            self._points.popleft()
        (t0, s0), (t1, s1) = self._points[0], self._points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def total(self) -> int:
        """Samples counted since the first update, across restarts."""
        return self._total

    def mark(self) -> tuple[float, int] | None:
        """(time, total) at the last update, for ``since``; None before any."""
        return self._points[-1] if self._points else None

    def since(self, mark: tuple[float, int] | None) -> float:
        """Mean global samples/s from ``mark`` (None: the start) to the last update. A mark
        taken before the first samples were counted counts from the first update that
        counted some (the samples it brought are left out with the time they took)."""
        end = self.mark()
        if end is None or self._first is None:
            return 0.0
        start = mark if mark is not None and mark[1] >= self._first[1] else self._first
        if end[0] <= start[0]:
            return 0.0
        return (end[1] - start[1]) / (end[0] - start[0])

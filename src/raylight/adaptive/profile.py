"""StepProfile: observed step times per layout, the input of fit_perf_params.

Workers send increments (sums and counts per layout); the driver merges them. Sums keep
the profile small however long the run, like AdaptDL's profile.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Layout = tuple[int, int, int, int]  # (num_nodes, num_replicas, atomic_bsz, threads)


@dataclass
class LayoutStats:
    accum_count: int = 0
    accum_time: float = 0.0  # sum of non-synchronising micro-step times
    optim_count: int = 0
    optim_time: float = 0.0  # sum of synchronising micro-step times

    def merge(self, other: LayoutStats) -> None:
        self.accum_count += other.accum_count
        self.accum_time += other.accum_time
        self.optim_count += other.optim_count
        self.optim_time += other.optim_time


@dataclass
class StepProfile:
    layouts: dict[Layout, LayoutStats] = field(default_factory=dict)

    def add(self, layout: Layout, *, accum_time: float | None = None, optim_time: float | None = None) -> None:
        stats = self.layouts.setdefault(layout, LayoutStats())
        if accum_time is not None:
            stats.accum_count += 1
            stats.accum_time += accum_time
        if optim_time is not None:
            stats.optim_count += 1
            stats.optim_time += optim_time

    def merge(self, other: StepProfile) -> None:
        for layout, stats in other.layouts.items():
            self.layouts.setdefault(layout, LayoutStats()).merge(stats)

    def observations(self, *, threads: int | None = None, min_steps: int = 1) -> tuple[np.ndarray, ...]:
        """Arrays (nodes, replicas, atomic_bsz, accum_step_time, optim_step_time) of mean
        times per layout with at least ``min_steps`` optimizer steps, for one thread count."""
        rows = [
            (n, k, m, s.accum_time / s.accum_count if s.accum_count else np.nan, s.optim_time / s.optim_count)
            for (n, k, m, t), s in sorted(self.layouts.items())
            if s.optim_count >= min_steps and (threads is None or t == threads)
        ]
        if not rows:
            return tuple(np.array([]) for _ in range(5))
        return tuple(np.array(col, dtype=float) for col in zip(*rows, strict=True))

    def thread_counts(self) -> list[int]:
        return sorted({t for (_, _, _, t) in self.layouts})

    def to_json(self) -> list[list[Any]]:
        return [[*layout, s.accum_count, s.accum_time, s.optim_count, s.optim_time] for layout, s in self.layouts.items()]

    @classmethod
    def from_json(cls, rows: list[list[Any]]) -> StepProfile:
        prof = cls()
        for n, k, m, t, ac, at, oc, ot in rows:
            prof.layouts[(int(n), int(k), int(m), int(t))] = LayoutStats(int(ac), float(at), int(oc), float(ot))
        return prof


class SampleRate:
    """Global samples/s over a sliding window of polls, robust to restarts."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()
        self._total = 0
        self._last_sum = 0

    def update(self, samples_now: int, now: float) -> float:
        delta = samples_now - self._last_sum
        if delta < 0:  # counters restarted with a new worker group
            delta = samples_now
        self._last_sum = samples_now
        self._total += delta
        self._points.append((now, self._total))
        while len(self._points) > 2 and now - self._points[0][0] > self.window_s:
            self._points.popleft()
        (t0, s0), (t1, s1) = self._points[0], self._points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

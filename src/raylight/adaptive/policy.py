"""Adaptive policies: fitted models and resources in, a decision out. No Ray, no torch.

BatchSizePolicy picks (atomic batch, accumulation steps) for the current layout;
ElasticPolicy picks the layout (workers x threads). Both change only when the
predicted gain clears a hysteresis margin, so they do not thrash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raylight.adaptive.goodput import GoodputFunction


@dataclass(frozen=True)
class BatchDecision:
    atomic_bsz: int
    accum_steps: int
    predicted_goodput: float
    current_goodput: float
    reason: str


class BatchSizePolicy:
    def __init__(
        self,
        *,
        init_batch_size: int,
        max_batch_size: int,
        local_bsz_bounds: tuple[int, int],
        accumulation: bool,
        threshold: float = 0.05,
    ) -> None:
        self.init_batch_size = init_batch_size
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = local_bsz_bounds
        self.accumulation = accumulation
        self.threshold = threshold

    def best(self, fn: GoodputFunction, *, num_nodes: int, num_replicas: int) -> tuple[float, int, int]:
        good, m, s = fn.optimize(
            num_nodes,
            num_replicas,
            max_batch_size=self.max_batch_size,
            atomic_bsz_range=self.local_bsz_bounds,
            accumulation=self.accumulation,
        )
        return float(good), int(m), int(s)

    def decide(
        self, fn: GoodputFunction, *, num_nodes: int, num_replicas: int, atomic_bsz: int, accum_steps: int
    ) -> BatchDecision | None:
        """A new (m, s) when it beats the current one by more than ``threshold``."""
        good, m, s = self.best(fn, num_nodes=num_nodes, num_replicas=num_replicas)
        current = float(fn.evaluate(num_nodes, num_replicas, atomic_bsz, accum_steps))
        if (m, s) == (atomic_bsz, accum_steps) or good <= current * (1 + self.threshold):
            return None
        batch = num_replicas * m * (s + 1)
        return BatchDecision(
            m,
            s,
            good,
            current,
            f"global batch {num_replicas * atomic_bsz * (accum_steps + 1)} -> {batch} "
            f"(atomic {m} x {s + 1} micro-steps): predicted goodput {good:.4g} vs {current:.4g}",
        )


@dataclass(frozen=True)
class Layout:
    num_workers: int
    threads: int


@dataclass(frozen=True)
class LayoutDecision:
    layout: Layout
    reason: str
    explore: bool = False


class ElasticPolicy:
    """Chooses how many workers (and threads each) maximise goodput.

    ``predict(layout)`` returns the best goodput the fitted models predict for a layout,
    or None when no model covers its thread count yet. ``candidates`` are the layouts the
    run may take now (the caller bounds them by its (min, max) and what fits). Rules, in
    order:
    - only a candidate; when the current layout is not one (the cluster shrank), the
      largest candidate;
    - explore, once, a layout whose thread count has never been measured, after the
      current layout has been measured;
    - grow only while SPEEDUP(K) / K >= ``utility_threshold`` (SPEEDUP relative to one
      worker);
    - switch only if the predicted goodput beats the current layout's by
      ``hysteresis`` and the time it saves over ``horizon_s`` exceeds ``restart_cost_s``.
    """

    def __init__(
        self,
        *,
        utility_threshold: float = 0.5,
        hysteresis: float = 0.1,
        horizon_s: float = 120.0,
    ) -> None:
        self.utility_threshold = utility_threshold
        self.hysteresis = hysteresis
        self.horizon_s = horizon_s

    def decide(
        self,
        *,
        current: Layout,
        candidates: list[Layout],
        predict: Callable[[Layout], float | None],
        explored: set[int],
        restart_cost_s: float,
    ) -> LayoutDecision | None:
        allowed = list(candidates)
        if not allowed:
            return None
        if current not in allowed:  # e.g. the cluster shrank below the current size
            fallback = max(allowed, key=lambda c: c.num_workers)
            return LayoutDecision(fallback, f"{current.num_workers} workers no longer fit")
        current_good = predict(current)
        if current_good is None:
            return None  # measure the current layout first
        for cand in sorted(allowed, key=lambda c: (c.threads, c.num_workers)):
            if cand.threads not in explored and predict(cand) is None:
                return LayoutDecision(
                    cand, f"exploring {cand.threads} thread(s) per worker (never measured)", explore=True
                )
        predicted = {c: predict(c) for c in allowed}
        base = max(
            (g for c, g in predicted.items() if c.num_workers == 1 and g is not None), default=None
        )
        scored: dict[Layout, float] = {}
        for cand, good in predicted.items():
            if good is None:
                continue
            if base and cand.num_workers > 1 and good / base / cand.num_workers < self.utility_threshold:
                continue
            scored[cand] = good
        if not scored:
            return None
        best = max(scored, key=lambda c: (scored[c], -c.num_workers))
        best_good = scored[best]
        if best == current or best_good <= current_good * (1 + self.hysteresis):
            return None
        saved_s = self.horizon_s * (1 - current_good / best_good)
        if saved_s <= restart_cost_s:
            return None
        return LayoutDecision(
            best,
            f"{best.num_workers} worker(s) x {best.threads} thread(s): predicted goodput "
            f"{best_good:.4g} vs {current_good:.4g} now; saves ~{saved_s:.1f}s over "
            f"{self.horizon_s:g}s against a restart cost of {restart_cost_s:.2f}s",
        )

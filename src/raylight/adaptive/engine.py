"""AdaptiveEngine: the driver's adaptive state, turned into decisions by the policies.

It merges what rank 0 measures (step times per layout, gradient statistics), refits a
throughput model per thread count, and asks BatchSizePolicy for the batch plan and
ElasticPolicy for the layout. Pure Python and numpy: the controller feeds it plain data
and executes what it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raylight.adaptive.goodput import (
    GoodputFunction,
    GradParams,
    PerfParams,
    gain,
    predict_step_time,
)
from raylight.adaptive.perf_model import fit_error, fit_perf_params
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.policy import BatchSizePolicy, ElasticPolicy, Layout, LayoutDecision
from raylight.adaptive.profile import StepProfile


@dataclass(frozen=True)
class EngineSettings:
    """What the engine needs of the run's config; built by the trainer
    (``trainer.engine_settings``), so every default has its one home in
    ``raylight.config.schema``."""

    adaptive: bool
    max_batch_size: int | None
    local_batch_bounds: tuple[int, int] | None
    accumulation: bool
    gain_threshold: float
    min_profile_steps: int
    profile_memory_steps: float | None  # None: every step weighs alike
    scaling_policy: str
    utility_threshold: float
    resize_hysteresis: float
    resize_horizon_s: float



@dataclass
class EngineState:
    profile: StepProfile = field(default_factory=StepProfile)
    init_batch_size: int | None = None
    dataset_size: int | None = None  # the training set's size: no global batch is larger
    grad_sqr: float = 0.0
    grad_var: float = 0.0
    plan: BatchPlan | None = None
    lr_factor: float = 1.0
    progress: float = 0.0
    explored: set[int] = field(default_factory=set)
    restart_costs: list[float] = field(default_factory=list)


REFIT_GROWTH = 1.25  # check a layout's fit when its step count grew by this factor
REFIT_MEMORY_SHARE = 0.125  # or by this share of the profile's memory, whichever is fewer
REFIT_TOLERANCE = 0.02  # and refit when it misses a layout's mean step time by more


def _grown(fitted: dict[Any, int], counts: dict[Any, int], memory_steps: float | None) -> bool:
    """A layout with REFIT_GROWTH times the steps it had when the fit was last checked,
    or, when the profile forgets, a share of its memory more: a recent mean keeps moving
    however many steps came before."""
    more = math.inf if memory_steps is None else REFIT_MEMORY_SHARE * memory_steps
    return any(counts[k] >= min(REFIT_GROWTH * fitted[k], fitted[k] + more) for k in counts)


class AdaptiveEngine:
    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.state = EngineState(profile=StepProfile(memory_steps=settings.profile_memory_steps))
        self._fits: dict[int, tuple[dict[Any, int], PerfParams]] = {}  # threads -> (step counts, fit)
        self._since_row = StepProfile()  # steps observed since the last trace row
        self.last_batch_reason = ""
        s = settings
        self.elastic_policy = ElasticPolicy(
            utility_threshold=s.utility_threshold if s.scaling_policy == "goodput" else 0.0,
            hysteresis=s.resize_hysteresis,
            horizon_s=s.resize_horizon_s,
        )

    # -- observations ---------------------------------------------------------------
    def observe(self, stats: AdaptiveStats) -> None:
        st = self.state
        increment = StepProfile.from_json(stats.profile)
        st.profile.merge(increment)
        self._since_row.merge(increment)
        st.init_batch_size = stats.init_batch_size
        st.dataset_size = stats.dataset_size
        st.grad_sqr, st.grad_var = stats.grad_sqr, stats.grad_var
        st.plan = stats.plan
        st.lr_factor, st.progress = stats.lr_factor, stats.progress
        st.explored.add(stats.threads)

    def record_restart(self, seconds: float) -> None:
        self.state.restart_costs.append(seconds)

    @property
    def restart_cost_s(self) -> float:
        costs = self.state.restart_costs
        return float(np.median(costs)) if costs else 5.0  # until one is measured

    # -- models ---------------------------------------------------------------------
    def perf_params(self, threads: int) -> PerfParams | None:
        """The throughput model for ``threads`` threads per worker, fitted to each
        layout's recency-weighted mean step time (weighted by its decayed step count). It
        is fitted afresh when the set of layouts changes; when a layout's step count grew
        enough since the last check (see ``_grown``), the fit is refined only if it misses
        a layout's mean by more than ``REFIT_TOLERANCE``: every fit costs the driver CPU
        that the workers beside it could use."""
        min_steps = self.settings.min_profile_steps
        counts = {
            layout: s.optim_count
            for layout, s in self.state.profile.layouts.items()
            if layout[3] == threads and s.optim_count >= min_steps
        }
        if not counts:
            return None
        cached = self._fits.get(threads)
        if cached is not None and cached[0].keys() == counts.keys():
            if _grown(cached[0], counts, self.settings.profile_memory_steps):
                obs = self.state.profile.observations(threads=threads, min_steps=min_steps)
                fit = cached[1]
                if fit_error(fit, *obs.times) > REFIT_TOLERANCE:  # refine the last fit
                    fit = fit_perf_params(**obs._asdict(), start=fit)
                self._fits[threads] = (counts, fit)
        else:
            obs = self.state.profile.observations(threads=threads, min_steps=min_steps)
            self._fits[threads] = (counts, fit_perf_params(**obs._asdict()))
        return self._fits[threads][1]

    @property
    def noise_measured(self) -> bool:
        return self.state.grad_sqr > 0 or self.state.grad_var > 0

    def grad_params(self) -> GradParams:
        m0 = self.state.init_batch_size or 1
        return GradParams(sqr=max(self.state.grad_sqr, 0.0), var=max(self.state.grad_var, 0.0) / m0)

    def goodput_fn(self, threads: int) -> GoodputFunction | None:
        perf = self.perf_params(threads)
        m0 = self.state.init_batch_size
        if perf is None or m0 is None:
            return None
        # With fixed batches, or before any noise is measured, efficiency is 1 at every
        # batch size considered (the fixed M0 only).
        # |G|^2 estimated at or below 0 means noise dominates: efficiency stays near 1.
        grad = self.grad_params() if self.settings.adaptive and self.noise_measured else GradParams(1.0, 0.0)
        return GoodputFunction(perf, grad, m0)

    def batch_policy(self, num_workers: int) -> BatchSizePolicy:
        m0 = self.state.init_batch_size or 1
        max_bsz = self.settings.max_batch_size or 32 * m0
        if self.state.dataset_size:  # a batch beyond the training set is one short step an epoch
            max_bsz = max(m0, min(max_bsz, self.state.dataset_size))
        bounds = self.settings.local_batch_bounds or (1, max_bsz)
        if not self.settings.adaptive:  # fixed global batch: M0 split over the workers
            per = max(1, m0 // num_workers)
            return BatchSizePolicy(
                init_batch_size=per * num_workers, max_batch_size=per * num_workers,
                local_bsz_bounds=(per, per), accumulation=False,
            )
        return BatchSizePolicy(
            init_batch_size=m0, max_batch_size=max_bsz, local_bsz_bounds=bounds,
            accumulation=self.settings.accumulation, threshold=self.settings.gain_threshold,
        )

    def predict(self, layout: Layout, num_nodes: int = 1) -> float | None:
        fn = self.goodput_fn(layout.threads)
        if fn is None:
            return None
        good, _, _ = self.batch_policy(layout.num_workers).best(fn, num_nodes=num_nodes, num_replicas=layout.num_workers)
        return good if good > 0 else None

    # -- decisions ------------------------------------------------------------------
    def decide_batch(self, *, num_workers: int, threads: int, num_nodes: int = 1) -> BatchPlan | None:
        """A new plan for the current layout, or None to keep it."""
        plan = self.state.plan
        fn = self.goodput_fn(threads)
        if not self.settings.adaptive or plan is None or fn is None or not self.noise_measured:
            return None
        decision = self.batch_policy(num_workers).decide(
            fn, num_nodes=num_nodes, num_replicas=num_workers, atomic_bsz=plan.atomic_bsz, accum_steps=plan.accum_steps
        )
        if decision is None:
            return None
        self.last_batch_reason = decision.reason
        return BatchPlan(decision.atomic_bsz, decision.accum_steps, plan.version + 1)

    def plan_for(self, num_workers: int, *, old_workers: int, threads: int, num_nodes: int = 1) -> BatchPlan | None:
        """The plan to run ``num_workers`` workers with after a resize: the best predicted
        one when a model exists, else the same global batch spread over them."""
        plan, m0 = self.state.plan, self.state.init_batch_size
        if plan is None or m0 is None:
            return None
        version = plan.version + 1
        if not self.settings.adaptive:
            return BatchPlan(max(1, m0 // num_workers), 0, version)
        fn = self.goodput_fn(threads)
        if fn is not None and self.noise_measured:
            good, m, s = self.batch_policy(num_workers).best(fn, num_nodes=num_nodes, num_replicas=num_workers)
            if good > 0:
                return BatchPlan(m, s, version)
        total = plan.global_batch(old_workers)
        steps = plan.accum_steps
        return BatchPlan(max(1, math.ceil(total / (num_workers * (steps + 1)))), steps, version)

    def decide_layout(self, *, current: Layout, candidates: list[Layout]) -> LayoutDecision | None:
        """The layout to run, among ``candidates`` (those the run may take now, within its
        bounds and what the cluster fits), or None to keep ``current``."""
        if self.settings.scaling_policy == "max":
            if not candidates:
                return None
            best = max(candidates, key=lambda c: c.num_workers)
            if best != current:
                return LayoutDecision(best, f"policy 'max': {best.num_workers} workers fit")
            return None
        return self.elastic_policy.decide(
            current=current,
            candidates=candidates,
            predict=self.predict,
            explored=self.state.explored,
            restart_cost_s=self.restart_cost_s,
        )

    # -- observability ------------------------------------------------------------------
    def display_fields(self, num_workers: int, threads: int) -> dict[str, Any]:
        """Global batch, LR factor (rank 0's, of its last control step) and statistical
        efficiency now, for the progress display."""
        plan = self.state.plan
        if plan is None or self.state.init_batch_size is None:
            return {}
        batch = plan.global_batch(num_workers)
        fields: dict[str, Any] = {"batch_size": batch}
        if self.settings.adaptive:
            fields["lr_factor"] = self.state.lr_factor
        if self.settings.adaptive and self.noise_measured:
            scale = batch / self.state.init_batch_size
            fields["efficiency"] = float(gain(scale, self.grad_params())) / scale
        return fields

    def trace_row(self, *, num_workers: int, threads: int, num_nodes: int = 1) -> dict[str, Any]:
        st = self.state
        plan = st.plan
        row: dict[str, Any] = {"workers": num_workers, "threads": threads, "lr_factor": st.lr_factor, "progress": st.progress}
        if plan is not None:
            row.update(atomic_bsz=plan.atomic_bsz, accum_steps=plan.accum_steps, global_batch=plan.global_batch(num_workers))
        if self.noise_measured:
            row.update(grad_sqr=st.grad_sqr, grad_var=st.grad_var)
            if st.grad_sqr > 0:
                row["noise_scale"] = st.grad_var / st.grad_sqr
        fn = self.goodput_fn(threads)
        if fn is not None and plan is not None:
            row["efficiency"] = float(fn.efficiency(plan.global_batch(num_workers)))
            row["predicted_throughput"] = float(fn.throughput(num_nodes, num_workers, plan.atomic_bsz, plan.accum_steps))
            row["predicted_goodput"] = float(fn.evaluate(num_nodes, num_workers, plan.atomic_bsz, plan.accum_steps))
            row["predicted_step_time"] = float(
                predict_step_time(fn.perf_params, num_nodes, num_workers, plan.atomic_bsz, plan.accum_steps)
            )
        # The steps since the previous row, at this plan: held out from the fit that row
        # predicted with (adaptive.jsonl pairs one row's prediction with the next's).
        since, self._since_row = self._since_row, StepProfile()
        if plan is not None:
            seen = since.layouts.get((num_nodes, num_workers, plan.atomic_bsz, threads))
            if seen is not None and seen.optim_count:
                row["measured_step_time"] = seen.step_time
                row["measured_steps"] = seen.optim_count
        return row

    def state_dict(self) -> dict[str, Any]:
        st = self.state
        return {
            "profile": st.profile.to_json(),
            "init_batch_size": st.init_batch_size,
            "dataset_size": st.dataset_size,
            "grad_sqr": st.grad_sqr,
            "grad_var": st.grad_var,
            "plan": None if st.plan is None else [st.plan.atomic_bsz, st.plan.accum_steps, st.plan.version],
            "explored": sorted(st.explored),
            "restart_costs": st.restart_costs,
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        st = self.state
        self._fits.clear()
        st.profile = StepProfile.from_json(data["profile"], memory_steps=self.settings.profile_memory_steps)
        st.init_batch_size = data["init_batch_size"]
        st.dataset_size = data.get("dataset_size")  # absent in states written before it was kept
        st.grad_sqr, st.grad_var = data["grad_sqr"], data["grad_var"]
        st.plan = BatchPlan(*data["plan"]) if data["plan"] else None
        st.explored = set(data["explored"])
        st.restart_costs = list(data["restart_costs"])

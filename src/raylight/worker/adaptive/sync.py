"""StepSync: keeps ranks in agreement, every ``every`` optimizer steps, at a step boundary.

A small control vector is summed over ranks on control steps. It carries, from rank 0,
the newest batch plan the driver sent it; from every rank, its gradient statistics of
the last measured step and whether the driver asked it to stop. After the all-reduce
every rank sees the same plan, updates an identical noise estimator, and either
continues or raises ``ResizeInterrupt`` at the same boundary, so no rank is left waiting
in a collective for a peer that stopped. Control steps are those whose index is a
multiple of ``every`` (the same on every rank); the gradient noise is measured on the
same steps.

With several replicas measuring gradient noise, the control step's gradients are
all-reduced by ``AdaptiveOptimizer`` in one flat tensor: the control vector rides at its
end (``take_outgoing`` / ``received``), so a control step costs no collective of its
own. What it brings applies once that optimizer step is done: the plan and the noise
estimate from the next step on, and a stop at the next ``begin_step``. Otherwise (one
replica, sharded gradients, elastic runs without adaptive batches, a loop without
``prepare_optimizer``) ``begin_step`` runs the control all-reduce itself (``boundary``).

A stop must not wait for the next control step when steps are long: a preemption notice
gives seconds, and 16 steps of half a second each are 8. So between control steps the
ranks also check for a stop (``stop_check``: an all-reduce of the stop flags alone) about
every STOP_CHECK_S: rank 0's mean step time rides on each control vector, and every rank
derives the same ``check_every`` from it (steps of STOP_CHECK_S or more: every step).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from raylight.adaptive.goodput import gain
from raylight.adaptive.lr import LRRule, lr_factor, progress_increment
from raylight.adaptive.noise import NoiseScaleEstimator
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.profile import StepProfile
from raylight.base.exceptions import ResizeInterrupt  # torch-free home: the launch agent raises it

# Slots of the control vector. Rank-0-only slots are zero elsewhere, so a SUM
# all-reduce hands rank 0's values to everyone.
CONTROL_SLOTS = 11
_STOP, _VERSION, _ATOMIC, _ACCUM, _SMALL_SQR, _BIG_SQR, _SMALL_B, _BIG_B, _VALID, _SNAPSHOT, _STEP_S = range(CONTROL_SLOTS)

# How often (seconds of training) the ranks check for a stop between control steps: the
# most a stop waits beyond the step in flight. A check is one all-reduce of a few numbers
# (well under a millisecond on gloo), so at this period it costs nothing measurable.
STOP_CHECK_S = 0.25

# The first optimizer steps at a new layout (a new batch size, or a new worker group) pay
# one-off costs, memory for the new tensor sizes among them, that the steady-state
# throughput model does not describe: they are not profiled. Measured on the adaptive
# benchmark's task (diamonds, 2 CPU workers): the first step at a new batch size took 4.2x
# the median step, the next nine 1.6-1.9x, later ones 1.3x on average (mean over median).
PROFILE_WARMUP_STEPS = 5


@dataclass
class _GradStats:
    small_sqr: float = 0.0
    big_sqr: float = 0.0
    small_batch: float = 0.0
    big_batch: float = 0.0
    valid: bool = False


class StepSync:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        num_nodes: int,
        threads: int,
        plan: BatchPlan,
        init_batch_size: int,
        adaptive: bool,
        lr_rule: LRRule = "none",
        lr_warmup_steps: float = 0.0,
        noise_smoothing: float = 0.98,
        every: int = 8,
        device: torch.device | None = None,
        replicated: bool = True,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.num_nodes = num_nodes
        self.threads = threads
        self.plan = plan
        self.init_batch_size = init_batch_size
        self.ready = False  # set when the training loader adopts this sync
        self.adaptive = adaptive
        self.lr_rule: LRRule = lr_rule if adaptive else "none"
        self.lr_warmup_steps = lr_warmup_steps
        self.gns = NoiseScaleEstimator(noise_smoothing)
        self.progress = 0.0  # scale-invariant, in optimizer steps at the initial batch
        self.dataset_size: int | None = None  # the training loader's samples per epoch, set when it adopts this
        self.profile = StepProfile()
        self._warm: tuple[tuple[int, int, int, int] | None, int] = (None, 0)  # layout, steps left
        self._lock = threading.Lock()
        self._pending_plan: BatchPlan | None = None
        self._stop = threading.Event()
        self._stats = _GradStats()
        # Micro-step position, set by the loader, read by the optimizer.
        self.micro = 0
        self.micro_steps = 1
        self.uniform_step = True  # False for an epoch's short last step
        self.every = every
        # Steps between stop checks (at most ``every``): agreed at each control step from
        # rank 0's mean step time, so every rank checks at the same steps; every step until
        # a step time is known (a group that just started).
        self.check_every = 1
        self._control_mark: tuple[float, int] | None = None  # rank 0: (time, step_count) at the last control
        self.device = device or torch.device("cpu")
        # Whether each rank holds its own, unreduced gradient (DDP) or only its shard of
        # the reduced one (FSDP): then the group measures noise as one replica does.
        self.replicated = replicated
        # The group's in-place sum: the process group's, or a faster one its strategy
        # offers (TrainContext.use_strategy_reducer: DDP's shared memory on CPU).
        self.reduce_sum: Callable[[torch.Tensor], Any] = dist.all_reduce
        # Set by AdaptiveOptimizer: its control-step all-reduce carries the control vector.
        self.carrier = False
        self.exchanging = False  # this step's control vector rides on the gradients
        self._stop_agreed = False  # a stop agreed in a step's all-reduce: raised at the next begin_step
        self._snapshot = threading.Event()  # the stop asked for asks for a checkpoint too
        self._snapshot_agreed = False
        self._received = True  # the last exchanging step's vector came back
        self.step_count = 0  # optimizer steps begun by this context
        self.measuring = False  # this step measures gradient noise (all micro-steps unsynced)
        self.phase = 0  # step_count % every of the current step
        self._last_tick: float | None = None
        self._prev: tuple[bool, bool, int] | None = None
        self._gain_cache: tuple[tuple[int, int], float] | None = None

    # -- called from the actor's main thread -------------------------------------------
    def set_plan(self, plan: BatchPlan) -> None:
        with self._lock:
            if plan.version > max(self.plan.version, self._pending_plan.version if self._pending_plan else -1):
                self._pending_plan = plan

    def request_stop(self, *, snapshot: bool = False) -> None:
        if snapshot:
            self._snapshot.set()
        self._stop.set()

    def drain_stats(self) -> AdaptiveStats:
        with self._lock:
            profile, self.profile = self.profile, StepProfile()
        sqr, var = self.gns.sqr, self.gns.var
        return AdaptiveStats(
            profile=profile.to_json(),
            plan=self.plan,
            init_batch_size=self.init_batch_size,
            grad_sqr=sqr,
            grad_var=var,
            lr_factor=self.lr_factor(),
            progress=self.progress,
            threads=self.threads,
            dataset_size=self.dataset_size,
        )

    # -- called from the training thread -------------------------------------------------
    def set_grad_stats(self, *, small_sqr: float, big_sqr: float, small_batch: float, big_batch: float) -> None:
        self._stats = _GradStats(small_sqr, big_sqr, small_batch, big_batch, True)

    def begin_step(self) -> BatchPlan:
        """Called by the training loader before each optimizer step: on control steps,
        agree with the other ranks (here, or in this step's gradient all-reduce); returns
        the plan for this step."""
        if self.exchanging and not self._received:
            self.boundary()  # that step never reached the optimizer (every rank alike): agree now
        self.exchanging = False
        if self._stop_agreed:
            self._stop_agreed = False
            raise ResizeInterrupt(snapshot=self._snapshot_agreed)
        self.phase = self.step_count % self.every
        self.step_count += 1
        # Replicas compare local and averaged gradients; one replica, or a group whose
        # gradients are sharded, compares micro-steps (phase 0) or, without accumulation,
        # two consecutive steps (phases 0 and 1).
        consecutive = self.as_one and self.phase == 1 and self.plan.accum_steps == 0
        self.measuring = self.adaptive and (self.phase == 0 or consecutive)
        self.exchanging = self.phase == 0 and self.measuring and not self.as_one and self.carrier
        self._received = not self.exchanging
        if self.phase == 0 and not self.exchanging:
            self.boundary()
        elif self.phase != 0 and (self.world_size == 1 or self.phase % self.check_every == 0):
            self.stop_check()
        return self.plan

    def stop_check(self) -> None:
        """Between control steps: raise ResizeInterrupt here, on every rank, if any rank
        was asked to stop (an all-reduce of the stop flags; alone, no collective)."""
        vec = [0.0] * CONTROL_SLOTS
        vec[_STOP] = 1.0 if self._stop.is_set() else 0.0
        vec[_SNAPSHOT] = 1.0 if self._snapshot.is_set() else 0.0
        if self.world_size > 1:
            summed = torch.tensor(vec, dtype=torch.float64, device=self.device)
            self.reduce_sum(summed)
            vec = summed.tolist()
        if vec[_STOP] > 0:
            raise ResizeInterrupt(snapshot=vec[_SNAPSHOT] > 0)

    @property
    def as_one(self) -> bool:
        """The gradients the optimizer sees are already the group's (one replica, or
        sharded): noise is measured across micro-steps or consecutive steps."""
        return self.world_size == 1 or not self.replicated

    def boundary(self) -> BatchPlan:
        """Agree on the plan for the next optimizer step with a control all-reduce of its
        own; raise ResizeInterrupt if any rank was asked to stop."""
        vec = torch.tensor(self.take_outgoing(), dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            self.reduce_sum(vec)
        self._apply(vec.tolist(), stop_now=True)
        return self.plan

    def take_outgoing(self) -> list[float]:
        """This rank's control vector (to be summed over ranks); hands over the gradient
        statistics it carries."""
        vec = [0.0] * CONTROL_SLOTS
        vec[_STOP] = 1.0 if self._stop.is_set() else 0.0
        vec[_SNAPSHOT] = 1.0 if self._snapshot.is_set() else 0.0
        stats, self._stats = self._stats, _GradStats()
        vec[_SMALL_SQR] = stats.small_sqr if stats.valid else 0.0
        if self.rank == 0:
            now = time.perf_counter()
            mark, self._control_mark = self._control_mark, (now, self.step_count)
            if mark is not None and self.step_count > mark[1]:
                vec[_STEP_S] = (now - mark[0]) / (self.step_count - mark[1])
            with self._lock:
                pending = self._pending_plan
            if pending is not None:
                vec[_VERSION], vec[_ATOMIC], vec[_ACCUM] = pending.version, pending.atomic_bsz, pending.accum_steps
            if stats.valid:
                vec[_BIG_SQR], vec[_SMALL_B], vec[_BIG_B], vec[_VALID] = (
                    stats.big_sqr, stats.small_batch, stats.big_batch, 1.0,
                )
        return vec

    def received(self, vec: Sequence[float]) -> None:
        """The summed control vector from a step's gradient all-reduce; call it after
        that optimizer step (its plan and LR factor are this step's)."""
        self._received = True
        self._apply(vec, stop_now=False)

    def _apply(self, vec: Sequence[float], *, stop_now: bool) -> None:
        if vec[_STOP] > 0:
            if stop_now:
                raise ResizeInterrupt(snapshot=vec[_SNAPSHOT] > 0)
            self._stop_agreed = True
            self._snapshot_agreed = vec[_SNAPSHOT] > 0
        step_s = float(vec[_STEP_S])
        if step_s > 0:
            self.check_every = max(1, min(self.every, int(STOP_CHECK_S / step_s)))
        version = int(vec[_VERSION])
        if version > self.plan.version:
            self.plan = BatchPlan(int(vec[_ATOMIC]), int(vec[_ACCUM]), version)
            with self._lock:
                if self._pending_plan is not None and self._pending_plan.version <= version:
                    self._pending_plan = None
        if vec[_VALID] > 0:
            self.gns.update(
                small_sqr=float(vec[_SMALL_SQR]) / self.world_size,
                small_batch=float(vec[_SMALL_B]),
                big_sqr=float(vec[_BIG_SQR]),
                big_batch=float(vec[_BIG_B]),
            )

    def tick(self, *, sync_step: bool) -> None:
        """Called as each micro-batch is handed out: the time since the previous one is
        that micro-step's duration (its compute, plus the all-reduces if it synced);
        rank 0 adds it to the profile, after PROFILE_WARMUP_STEPS at the layout."""
        now = time.perf_counter()
        last, self._last_tick = self._last_tick, now
        prev, self._prev = self._prev, (sync_step, self.uniform_step, self.plan.atomic_bsz)
        if self.rank != 0 or last is None or prev is None or not prev[1]:
            return
        was_sync, _, atomic = prev
        layout = (self.num_nodes, self.world_size, atomic, self.threads)
        if layout != self._warm[0]:
            self._warm = (layout, PROFILE_WARMUP_STEPS)
        left = self._warm[1]
        if left > 0:  # warming up at this layout: not a steady-state step
            if was_sync:
                self._warm = (layout, left - 1)
            return
        with self._lock:
            if was_sync:
                self.profile.add(layout, optim_time=now - last)
            else:
                self.profile.add(layout, accum_time=now - last)

    def pause_clock(self) -> None:
        """Close the current micro-step: time outside the loop (evaluation, epoch end)
        is not a step, so the step in progress is not timed."""
        self._last_tick = None
        self._prev = None

    # -- learning rate ----------------------------------------------------------------
    def scale(self) -> float:
        return self.plan.global_batch(self.world_size) / self.init_batch_size

    def gain(self) -> float:
        scale = self.scale()
        if not self.gns.ready or scale == 1.0:
            return 1.0  # no noise measured yet: no claim that a big batch is worth more
        return float(gain(scale, self.gns.grad_params(self.init_batch_size)))

    def _gain_now(self) -> float:
        """gain() for the current plan and noise estimate, computed once per change."""
        key = (self.plan.version, self.gns.num_updates)
        if self._gain_cache is None or self._gain_cache[0] != key:
            self._gain_cache = (key, self.gain())
        return self._gain_cache[1]

    def lr_factor(self) -> float:
        return float(
            lr_factor(self.lr_rule, self.scale(), self._gain_now(), progress=self.progress, warmup_steps=self.lr_warmup_steps)
        )

    def advance_progress(self) -> None:
        self.progress += progress_increment(self.lr_rule, self.scale(), self._gain_now())

    # -- checkpoint state -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"gns": self.gns.state_dict(), "progress": self.progress, "plan": [self.plan.atomic_bsz, self.plan.accum_steps, self.plan.version]}

    def load_state_dict(self, state: dict) -> None:
        self.gns.load_state_dict(state["gns"])
        self.progress = float(state["progress"])


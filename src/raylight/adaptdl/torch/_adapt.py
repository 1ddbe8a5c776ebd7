"""The batch size an AdaptiveDataLoader trains with, chosen by raylight's adaptive engine
(``raylight.adaptive.engine.AdaptiveEngine``) inside the script: rank 0 profiles each
micro-step's time per layout (replicas, local batch, threads), AdaptiveDataParallel
measures the gradient noise (the local and the averaged gradient's norms), and every
``DECIDE_EVERY`` optimizer steps rank 0 asks the engine for a plan, which every replica
takes (a broadcast). As AdaptDL, one replica keeps its batch: its noise is not measured.
"""

from __future__ import annotations

import math
from typing import IO, Any

import torch

from raylight.adaptdl import checkpoint, collective, env
from raylight.adaptive.engine import AdaptiveEngine, EngineSettings
from raylight.adaptive.noise import NoiseScaleEstimator
from raylight.adaptive.plan import AdaptiveStats, BatchPlan
from raylight.adaptive.profile import StepProfile
from raylight.config import AdaptiveConfig, ScalingConfig

DECIDE_EVERY = 10  # optimizer steps between two decisions (each one broadcast)


class Adapter(checkpoint.State):
    """One loader's plan, profile and decisions (a State: they continue after a restart)."""

    def __init__(self, name: str, batch_size: int) -> None:
        super().__init__(name)
        self.init_batch_size = batch_size
        self.max_batch_size: int | None = None
        self.bounds: tuple[int, int] | None = None
        self.accumulation = False
        self.engine: AdaptiveEngine | None = None
        self.increment = StepProfile()
        self.replicas = env.num_replicas()
        self.plan = self._split(batch_size, 0)
        self.steps = 0
        self.loaded: dict[str, Any] | None = None

    def _split(self, global_batch: int, accum: int) -> BatchPlan:
        atomic = max(1, math.ceil(global_batch / (self.replicas * (accum + 1))))
        if self.bounds is not None:
            atomic = min(max(atomic, self.bounds[0]), self.bounds[1])
        return BatchPlan(atomic, accum, 0)

    def autoscale(self, max_batch_size: int, bounds: tuple[int, int] | None, accumulation: bool) -> None:
        if max_batch_size < self.init_batch_size:
            raise ValueError(f"autoscale_batch_size(max_batch_size={max_batch_size}): below the loader's batch_size "
                             f"{self.init_batch_size}; give a max_batch_size >= batch_size")
        if bounds is not None and not (1 <= bounds[0] <= bounds[1]):
            raise ValueError(f"autoscale_batch_size(local_bsz_bounds={bounds}): expected (low, high) with 1 <= low <= high")
        self.max_batch_size, self.bounds, self.accumulation = max_batch_size, bounds, accumulation
        a, s = AdaptiveConfig(), ScalingConfig()
        self.engine = AdaptiveEngine(EngineSettings(
            adaptive=True, max_batch_size=max_batch_size, local_batch_bounds=bounds, accumulation=accumulation,
            gain_threshold=a.gain_threshold, min_profile_steps=a.min_profile_steps,
            profile_memory_steps=a.profile_memory_steps, scaling_policy="max",
            utility_threshold=s.utility_threshold, resize_hysteresis=s.resize_hysteresis,
            resize_horizon_s=s.resize_horizon_s,
        ))
        if self.loaded is not None:
            self._restore(self.loaded)
        else:
            self.plan = self._split(self.init_batch_size, 0)

    @property
    def adaptive(self) -> bool:
        return self.engine is not None and (self.max_batch_size or 0) > self.init_batch_size

    def record(self, seconds: float, *, optim: bool) -> None:
        layout = (env.num_nodes(), self.replicas, self.plan.atomic_bsz, torch.get_num_threads())
        if optim:
            self.increment.add(layout, optim_time=seconds)
        else:
            self.increment.add(layout, accum_time=seconds)

    def after_step(self, noise: NoiseScaleEstimator | None, dataset_size: int) -> None:
        """At an optimizer step's end, on every replica alike."""
        self.steps += 1
        if not self.adaptive or self.replicas < 2 or self.steps % DECIDE_EVERY:
            return
        choice = None
        if env.replica_rank() == 0 and self.engine is not None and noise is not None and noise.ready:
            self.engine.observe(AdaptiveStats(
                profile=self.increment.to_json(), plan=self.plan, init_batch_size=self.init_batch_size,
                grad_sqr=noise.sqr, grad_var=noise.var, lr_factor=1.0, progress=0.0,
                threads=torch.get_num_threads(), dataset_size=dataset_size,
            ))
            plan = self.engine.decide_batch(num_workers=self.replicas, threads=torch.get_num_threads(), num_nodes=env.num_nodes())
            choice = None if plan is None else (plan.atomic_bsz, plan.accum_steps)
        self.increment = StepProfile()
        choice = collective.broadcast(choice)
        if choice is not None:
            self.plan = BatchPlan(choice[0], choice[1], self.plan.version + 1)

    # -- State -------------------------------------------------------------------------
    def save(self, fileobj: IO[bytes]) -> None:
        torch.save({
            "global_batch": self.plan.global_batch(self.replicas), "accum": self.plan.accum_steps,
            "steps": self.steps, "engine": None if self.engine is None else _plain(self.engine.state_dict()),
        }, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self.loaded = torch.load(fileobj, weights_only=True)
        self._restore(self.loaded)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.steps = int(saved["steps"])
        self.plan = self._split(int(saved["global_batch"]), int(saved["accum"]))  # the same global batch, this many replicas
        if self.engine is not None and saved["engine"] is not None:
            self.engine.load_state_dict(saved["engine"])


def _plain(value: Any) -> Any:
    """JSON-like data (torch.load's weights_only reads it back): tuples as lists, numbers as Python's."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value

"""Distributed hyperparameter search on Ray Tune: each trial is a raylight run.

Optional extra: needs ``ray[tune]`` (``pip install 'raylight[tune]'``).

- ``trainable(loop, num_workers=...)``: a Tune trainable whose trials train on raylight
  workers placed in the trial's placement group; reports reach ``ray.tune.report``,
  checkpoints become ``ray.tune.Checkpoint`` (and back, for PBT).
- ``get_tune_resources(num_workers=..., use_gpu=..., cpus_per_worker=...)``: the trial's
  ``PlacementGroupFactory``.
- ``connect(address=None)``: start or join Ray the way raylight does, before a Tuner.
- ``check_resources(...)``: fail fast when a trial can never be placed, and the number
  of trials that fit side by side.
- ``TuneReportCallback``, ``TuneReportCheckpointCallback``: Lightning callbacks that
  report to Tune.

Any product may use it; it uses none of them (the declarative search behind
``raylight hyperopt`` is ``raylight.declarative.hyperopt``).
"""

from __future__ import annotations

from typing import Any

try:
    import ray.tune  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("raylight.tune needs Ray Tune: pip install 'raylight[tune]'") from exc

from raylight.tune.resources import ConcurrencyPlan, get_tune_resources, plan_concurrency
from raylight.tune.trial import from_tune_checkpoint, to_tune_checkpoint, trainable

__all__ = [
    "ConcurrencyPlan",
    "TuneReportCallback",
    "TuneReportCheckpointCallback",
    "check_resources",
    "connect",
    "from_tune_checkpoint",
    "get_tune_resources",
    "plan_concurrency",
    "to_tune_checkpoint",
    "trainable",
]


def connect(address: str | None = None) -> None:
    """Connect to Ray as ``raylight.fit`` does, before building a ``Tuner``: the running
    Ray of this process, ``address`` or ``RAY_ADDRESS``, else an embedded local one
    bound to 127.0.0.1 (never some other cluster found on the machine)."""
    from raylight.driver import runtime

    runtime.connect(address)


def check_resources(resources: Any, *, num_trials: int = 1, max_concurrent_trials: int | str = "auto") -> ConcurrencyPlan:
    """Check that a trial with ``resources`` (a ``PlacementGroupFactory`` or a trainable
    made by ``trainable``) can ever be placed on the connected cluster, and how many fit
    at once. Raises InsufficientResourcesError with the numbers otherwise."""
    from raylight.tune.resources import check_bundles_fit, cluster_view, total

    pgf = getattr(resources, "_resources", resources)  # tune.with_resources keeps it there
    if not hasattr(pgf, "bundles"):
        raise TypeError(f"expected a PlacementGroupFactory or a raylight.tune.trainable, got {type(resources).__name__}")
    bundles = [dict(b) for b in pgf.bundles]
    cluster, nodes = cluster_view()
    setting = "num_workers or resources_per_worker"
    check_bundles_fit(bundles, nodes, setting)
    return plan_concurrency(
        per_trial=total(bundles), cluster=cluster, nodes=nodes, num_trials=num_trials,
        requested=max_concurrent_trials, setting=setting,
    )


def __getattr__(name: str) -> Any:  # lazy: Lightning is optional
    if name in ("TuneReportCallback", "TuneReportCheckpointCallback"):
        from raylight.tune import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'raylight.tune' has no attribute {name!r}")

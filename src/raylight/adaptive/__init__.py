"""The adaptive engine's model, pure and vectorised (numpy and scipy only).

Goodput = throughput x statistical efficiency (Pollux / AdaptDL). The names match
AdaptDL's so its users feel at home. They load on first use: the package's plain data
(``adaptive.plan``) is imported by the worker group and the recorder, which need no
scipy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams, predict_step_time
    from raylight.adaptive.lr import LR_RULES, lr_factor
    from raylight.adaptive.noise import NoiseScaleEstimator
    from raylight.adaptive.perf_model import fit_perf_params
    from raylight.adaptive.policy import BatchSizePolicy, ElasticPolicy, Layout

_LAZY = {
    "GoodputFunction": "goodput", "GradParams": "goodput", "PerfParams": "goodput", "predict_step_time": "goodput",
    "LR_RULES": "lr", "lr_factor": "lr", "NoiseScaleEstimator": "noise", "fit_perf_params": "perf_model",
    "BatchSizePolicy": "policy", "ElasticPolicy": "policy", "Layout": "policy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"raylight.adaptive.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raylight.adaptive' has no attribute {name!r}")


__all__ = [
    "LR_RULES",
    "BatchSizePolicy",
    "ElasticPolicy",
    "GoodputFunction",
    "GradParams",
    "Layout",
    "NoiseScaleEstimator",
    "PerfParams",
    "fit_perf_params",
    "lr_factor",
    "predict_step_time",
]

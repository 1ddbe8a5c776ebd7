"""The adaptive engine's model, pure and vectorised (numpy and scipy only).

Goodput = throughput x statistical efficiency (Pollux / AdaptDL). The names match
AdaptDL's so its users feel at home.
"""

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams, predict_step_time
from raylight.adaptive.lr import LR_RULES, lr_factor
from raylight.adaptive.noise import NoiseScaleEstimator
from raylight.adaptive.perf_model import fit_perf_params
from raylight.adaptive.policy import BatchSizePolicy, ElasticPolicy, Layout

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

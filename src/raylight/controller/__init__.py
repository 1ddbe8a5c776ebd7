"""Driver-side control plane: the state machine, its decisions and policies."""

from raylight.controller.controller import Controller, Phase, State
from raylight.controller.decisions import Raise, RequestResources, Resize, Restart, SetPlan
from raylight.controller.policies import (
    FailurePolicy,
    FixedScalingPolicy,
    ScalingPolicy,
    ScalingView,
)
from raylight.controller.scaling import GoodputScalingPolicy, ScalingSettings
from raylight.controller.telemetry import RunTelemetry

__all__ = [
    "Controller",
    "FailurePolicy",
    "FixedScalingPolicy",
    "GoodputScalingPolicy",
    "Phase",
    "Raise",
    "RequestResources",
    "Resize",
    "Restart",
    "RunTelemetry",
    "ScalingPolicy",
    "ScalingSettings",
    "ScalingView",
    "SetPlan",
    "State",
]

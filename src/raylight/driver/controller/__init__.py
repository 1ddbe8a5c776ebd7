"""Driver-side control plane: the state machine, its decisions and policies."""

from raylight.driver.controller.controller import Controller, Phase, State
from raylight.driver.controller.decisions import Raise, RequestResources, Resize, Restart, SetPlan
from raylight.driver.controller.policies import (
    FailurePolicy,
    FixedScalingPolicy,
    ScalingPolicy,
    ScalingView,
)
from raylight.driver.controller.scaling import GoodputScalingPolicy, ScalingSettings
from raylight.driver.controller.telemetry import RunTelemetry

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

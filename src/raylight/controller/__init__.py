"""Driver-side control plane: the state machine, its decisions and policies."""

from raylight.controller.controller import Controller, State
from raylight.controller.decisions import (
    ContinueDecision,
    RaiseDecision,
    ResizeDecision,
    RestartDecision,
)
from raylight.controller.policies import FailurePolicy, FixedScalingPolicy, ScalingPolicy

__all__ = [
    "ContinueDecision",
    "Controller",
    "FailurePolicy",
    "FixedScalingPolicy",
    "RaiseDecision",
    "ResizeDecision",
    "RestartDecision",
    "ScalingPolicy",
    "State",
]

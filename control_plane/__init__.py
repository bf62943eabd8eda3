"""LIFL control plane: placement, hierarchy planning, aggregator reuse, coordinator, scaling.

Pure algorithms (no I/O): :func:`place`, :func:`residual_capacity`, :func:`plan_hierarchy`,
:func:`replan`, :func:`diff_plans`, :class:`QueueEstimator`, :func:`assign_replicas`,
:func:`find_knee`, :func:`replicas_wanted`. Services: :class:`Coordinator` (it scales the
``aggregator`` function through :class:`core.openfaas.AsyncOpenFaaS`),
:func:`calibrate` / :func:`measure_gateway`, and ``python -m control_plane`` (the HTTP API).
"""

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.calibrate import Calibration, calibrate, find_knee, measure_gateway
from control_plane.coordinator import Coordinator
from control_plane.errors import ControlPlaneError
from control_plane.jobs import JobSpec
from control_plane.placement import POLICIES, Placement, place, residual_capacity
from control_plane.planning import (
    Plan,
    PlanDiff,
    QueueEstimator,
    diff_plans,
    plan_hierarchy,
    replan,
)
from control_plane.reuse import AggregatorState, ReplicaAssignment, ReplicaState, assign_replicas

__all__ = [
    "POLICIES",
    "AggregatorState",
    "Calibration",
    "ControlPlaneError",
    "Coordinator",
    "NodeLoad",
    "JobSpec",
    "Placement",
    "Plan",
    "PlanDiff",
    "ScaleBounds",
    "QueueEstimator",
    "ReplicaAssignment",
    "ReplicaState",
    "assign_replicas",
    "calibrate",
    "diff_plans",
    "find_knee",
    "measure_gateway",
    "place",
    "plan_hierarchy",
    "replan",
    "replicas_wanted",
    "residual_capacity",
]

"""A job's secure aggregation as the control plane sees it at creation (:mod:`core.secagg`).

The SDK declares it in the initial weights' ``__metadata__["fedfaas.secagg"]`` (the node
gateways read the same entry, :mod:`gateway.secagg`). The control plane keeps the parameters
with the job (:attr:`control_plane.jobs.JobState.secagg`) to run each round's stages
(:mod:`control_plane.secagg_stages`), and refuses a job that also asks for what reads
individual updates: ``drop_flagged`` has FLStore read each client's update, which secure
aggregation hides (the gateways refuse robust rules, FedBuff, server optimizers and
evaluators for it).
"""

from __future__ import annotations

import json

from control_plane.errors import ControlPlaneError
from control_plane.jobs import JobSpec
from core import wire
from core.secagg.config import METADATA_KEY, SecAggConfig, SecAggConfigError, refusals


class BadSecureAggregation(ControlPlaneError):
    """A job's secure aggregation cannot work as asked; the detail says why."""

    code = "bad_secure_aggregation"
    status = 400


def declared(weights: bytes, spec: JobSpec) -> SecAggConfig | None:
    """The parameters ``weights`` declare (None: no secure aggregation), checked against the
    job's other options and its goal. :class:`BadSecureAggregation` saying what is wrong."""
    try:
        _, start = wire.parse_raw_header(weights, wire.DEFAULT_MAX_HEADER)
        meta = json.loads(bytes(weights[8:start])).get("__metadata__") or {}
    except (wire.WireError, ValueError, AttributeError):
        return None  # the gateways answer a bad header with what is wrong
    raw = meta.get(METADATA_KEY) if isinstance(meta, dict) else None
    if raw is None:
        return None
    try:
        cfg = SecAggConfig.from_spec(json.loads(raw))
        cfg.check_round(spec.goal)
    except (SecAggConfigError, ValueError) as exc:
        raise BadSecureAggregation(f"__metadata__[{METADATA_KEY!r}]: {exc}") from None
    why = refusals({"drop_flagged": spec.drop_flagged})
    if why:
        raise BadSecureAggregation(f"a job with secure aggregation cannot use {'; '.join(why)}")
    return cfg

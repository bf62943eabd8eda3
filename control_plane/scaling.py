"""Scaling the aggregator function to the nodes' load (the decision is
:func:`control_plane.autoscale.replicas_wanted`; this part reads the load and calls the
provider)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.base import CoordinatorBase
from core.openfaas import FunctionStatus, OpenFaaSError

log = logging.getLogger(__name__)


class Autoscaling(CoordinatorBase):
    """Scales ``function`` through the provider API from the gateways' health reports."""

    async def autoscale(self, reports: Mapping[str, dict[str, Any]]) -> None:
        """Scale ``function`` to what the nodes' aggregator loads ask for (see
        :mod:`control_plane.autoscale`): up when a node lacks endpoints, down to the minimum
        after ``scale_down_after`` idle seconds."""
        if self.provider is None:
            return
        loads = [node_load(n, body) for n, body in reports.items()]
        now = self.clock()
        if not loads or not all(x.idle for x in loads):  # no report is no evidence of idling
            self._busy_at = now
        try:
            # the provider client asks again on a 5xx or no answer (core.openfaas)
            st = await self.provider.function(self.function)
            if st is None:
                raise OpenFaaSError(f"function {self.function!r} is not deployed", 404)
            lo, hi = st.scale_bounds()
            want = replicas_wanted(
                loads,
                desired=st.replicas,
                available=st.available_replicas,
                endpoints_per_replica=endpoints_per_replica(st),
                bounds=ScaleBounds(lo, hi),
                idle_for_s=now - self._busy_at,
                idle_s=self.scale_down_after,
            )
            if want != st.replicas:
                await self.provider.scale(self.function, want)
                log.info(
                    "%s: %d -> %d replicas (short of %s endpoints; per node endpoints/free/"
                    "waiting slots/queue %s)",
                    self.function,
                    st.replicas,
                    want,
                    {x.node: x.shortage for x in loads if x.shortage},
                    {
                        x.node: f"{x.endpoints}/{x.free_endpoints}/{x.waiting_slots}/{x.queue:.2f}"
                        for x in loads
                    },
                )
            self.last_scale, self.scale_error = want, None
        except OpenFaaSError as exc:  # the control loop goes on: said, counted, next tick
            self.scale_error = exc.detail
            self.scale_failures += 1
            log.warning("autoscale of %s failed: %s", self.function, exc.detail)


def endpoints_per_replica(st: FunctionStatus) -> int:
    """Endpoints one replica of the aggregator registers: its ``FEDFAAS_AGGREGATOR_ENDPOINTS``
    as deployed (the replica's default, 2, when unset or unreadable)."""
    env = st.raw.get("envVars") or {}
    try:
        return max(1, int(env.get("FEDFAAS_AGGREGATOR_ENDPOINTS", 2)))
    except (TypeError, ValueError, AttributeError):
        return 2


def node_load(node: str, health: Mapping[str, Any]) -> NodeLoad:
    """A gateway's ``/healthz`` ``aggregators`` block as a :class:`NodeLoad` (zeros if absent)."""
    agg = health.get("aggregators") or {}

    def num(key: str) -> float:
        try:
            return float(agg.get(key) or 0)
        except (TypeError, ValueError):
            return 0.0

    return NodeLoad(
        node,
        endpoints=int(num("endpoints")),
        free_endpoints=int(num("free_endpoints")),
        waiting_slots=int(num("waiting_slots")),
        queue=num("queue"),
    )

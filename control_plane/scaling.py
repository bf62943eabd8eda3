"""Scaling the aggregator function to the nodes' load (the decision is
:func:`control_plane.autoscale.replicas_wanted`; this part reads the load and calls the
provider)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.base import CoordinatorBase
from fedfaas.openfaas import FunctionStatus, OpenFaaSError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: seconds between the tries of one provider call that failed for a reason that may pass (a
#: 5xx, no answer): three tries over about 1.5 s. faas-netes answers 500 "unable to update
#: function deployment" when its Deployment write meets another writer's (seen in CI).
PROVIDER_RETRY_DELAYS_S = (0.5, 1.0)


def transient(exc: OpenFaaSError) -> bool:
    """Whether asking again may succeed: a 5xx or no answer (``status`` 0), not a 4xx."""
    return exc.status == 0 or exc.status >= 500


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
            provider = self.provider
            st = await self._provider_call(lambda: provider.function(self.function))
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
                await self._provider_call(lambda: provider.scale(self.function, want))
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

    async def _provider_call(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, tried again after each of :data:`PROVIDER_RETRY_DELAYS_S` while it fails
        transiently (:func:`transient`); a 4xx goes up at once, the last try's error saying how
        many tries were made."""
        for delay in PROVIDER_RETRY_DELAYS_S:
            try:
                return await call()
            except OpenFaaSError as exc:
                if not transient(exc):
                    raise
                log.info("provider call failed (%s); again in %.1f s", exc.detail, delay)
                await asyncio.sleep(delay)
        try:
            return await call()
        except OpenFaaSError as exc:
            if transient(exc):
                exc.detail = f"{exc.detail} ({len(PROVIDER_RETRY_DELAYS_S) + 1} tries)"
            raise


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

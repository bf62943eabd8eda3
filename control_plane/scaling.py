"""Scaling the aggregator functions to the nodes' load (the decision is
:func:`control_plane.autoscale.replicas_wanted`; this part reads the load, finds the function
that serves each gateway and calls the provider).

One function serves a gateway's node: ``function`` (``aggregator``) by default. The chart's
``nodeGateway.perNode`` runs more gateways on one machine, the i-th (i > 0) named
``<node>-<i>`` and served by its own function ``<function>-<i>`` (charts/fedfaas
``node-gateway.yaml`` and ``aggregator.yaml``): a replica of another function registers with
another gateway's router and never serves it. So a gateway ``<base>-<i>`` whose ``<base>`` is a
gateway the control plane knows is served by ``<function>-<i>`` when the provider has that
function, by ``function`` otherwise; each function is scaled by its own gateways' shortages.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from typing import Any

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.base import CoordinatorBase
from core.openfaas import FunctionStatus, OpenFaaSError

log = logging.getLogger(__name__)

_NTH_GATEWAY = re.compile(r"(.+)-([1-9][0-9]*)")


class Autoscaling(CoordinatorBase):
    """Scales each gateway's aggregator function through the provider API from the gateways'
    health reports."""

    async def autoscale(self, reports: Mapping[str, dict[str, Any]]) -> None:
        """Scale every aggregator function to what its gateways' loads ask for (see
        :mod:`control_plane.autoscale`): up when a gateway it serves lacks endpoints, down to
        the minimum after ``scale_down_after`` seconds with every node idle. ``function`` is
        looked at on every call (with no report it stays as it is); ``<function>-<i>`` only
        while a gateway it serves reports."""
        if self.provider is None:
            return
        loads = [node_load(n, body) for n, body in reports.items()]
        now = self.clock()
        if not loads or not all(x.idle for x in loads):  # no report is no evidence of idling
            self._busy_at = now
        errors: list[str] = []
        groups: dict[str, list[NodeLoad]] = {self.function: []}
        others: dict[str, FunctionStatus | None] = {}  # statuses of <function>-<i> read
        unread: set[str] = set()  # functions whose status the provider did not give
        for x in loads:
            function = gateway_function(x.node, self.nodes, self.function)
            if function != self.function and function not in others and function not in unread:
                try:
                    # the provider client asks again on a 5xx or no answer (core.openfaas)
                    others[function] = await self.provider.function(function)
                except OpenFaaSError as exc:
                    self._failed(function, exc, errors)
                    unread.add(function)
            if function in unread:
                continue  # not the first function's gateway either: scaled by none this tick
            if function != self.function and others[function] is None:
                function = self.function  # no such function: the first one serves this node
            groups.setdefault(function, []).append(x)
        for function, its_loads in groups.items():
            try:
                st = others.get(function) or await self.provider.function(function)
                if st is None:
                    raise OpenFaaSError(f"function {function!r} is not deployed", 404)
                want = await self._scale(function, st, its_loads, now)
            except OpenFaaSError as exc:
                self._failed(function, exc, errors)
                continue
            if function == self.function:
                self.last_scale = want
        self.scale_error = "; ".join(errors) or None

    def _failed(self, function: str, exc: OpenFaaSError, errors: list[str]) -> None:
        """The control loop goes on: said, counted, next tick."""
        errors.append(exc.detail)
        self.scale_failures += 1
        log.warning("autoscale of %s failed: %s", function, exc.detail)

    async def _scale(
        self, function: str, st: FunctionStatus, loads: list[NodeLoad], now: float
    ) -> int:
        """Ask the provider for the replicas ``function`` needs for ``loads`` (its gateways')."""
        assert self.provider is not None
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
            await self.provider.scale(function, want)
            log.info(
                "%s: %d -> %d replicas (short of %s endpoints; per node endpoints/free/"
                "waiting slots/queue %s)",
                function,
                st.replicas,
                want,
                {x.node: x.shortage for x in loads if x.shortage},
                {
                    x.node: f"{x.endpoints}/{x.free_endpoints}/{x.waiting_slots}/{x.queue:.2f}"
                    for x in loads
                },
            )
        return want


def gateway_function(node: str, nodes: Collection[str], function: str) -> str:
    """The function that would serve gateway ``node``: ``<function>-<i>`` when ``node`` is
    ``<base>-<i>`` (i > 0) and ``<base>`` is a gateway in ``nodes`` (the chart's i-th gateway
    on ``<base>``'s machine), else ``function``. The caller falls back to ``function`` when
    the provider has no ``<function>-<i>``."""
    m = _NTH_GATEWAY.fullmatch(node)
    if m is None or m[1] not in nodes:
        return function
    return f"{function}-{m[2]}"


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

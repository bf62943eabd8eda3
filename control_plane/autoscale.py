"""How many ``aggregator`` replicas to ask the provider for. Pure.

Each node gateway reports its aggregator endpoints (registered, free) and its load: slots of
open rounds that found no free endpoint (``waiting_slots``) and the queue ``Q = k * E``
(arrival rate times mean task time: the tasks it expects to run at once; per round at most
the tasks it has left on that node, see ``gateway.control.node_load``). A node is short of
``max(waiting_slots, ceil(Q) - endpoints)`` endpoints. The function scales up by enough
replicas to cover the shortage of every node (``endpoints_per_replica`` each); new replicas
register with their node's router and take the waiting slots. It scales back down to its
minimum once every node has been idle (no waiting slot, every endpoint free, no queue) for
``idle_s`` seconds. While a scale-up is still starting (fewer replicas available than asked
for), nothing more is asked: the new replicas' endpoints are not counted yet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLoad:
    """One node gateway's aggregators and load, from its ``/healthz``."""

    node: str
    endpoints: int
    free_endpoints: int
    waiting_slots: int
    queue: float = 0.0

    @property
    def shortage(self) -> int:
        """Endpoints this node lacks now."""
        by_queue = math.ceil(self.queue - 1e-9) - self.endpoints if self.queue > 0 else 0
        return max(0, self.waiting_slots, by_queue)

    @property
    def idle(self) -> bool:
        return self.waiting_slots == 0 and self.free_endpoints == self.endpoints and not self.queue


@dataclass(frozen=True)
class ScaleBounds:
    """The function's replica bounds (``com.openfaas.scale.min`` / ``.max``)."""

    min: int = 1
    max: int = 20


def replicas_wanted(
    loads: Iterable[NodeLoad],
    *,
    desired: int,
    available: int,
    endpoints_per_replica: int,
    bounds: ScaleBounds,
    idle_for_s: float,
    idle_s: float = 30.0,
) -> int:
    """The replica count to ask for now (``desired`` when nothing should change).

    Parameters
    ----------
    loads
        Every healthy node's report.
    desired, available
        What the provider reports: replicas asked for and replicas ready.
    endpoints_per_replica
        Endpoints one replica registers (``FEDFAAS_AGGREGATOR_ENDPOINTS``).
    bounds
        Replica bounds of the function.
    idle_for_s
        How long every node has been idle (0 when one is not).
    idle_s
        Idle time after which the function scales down to ``bounds.min``.
    """
    loads = list(loads)
    short = sum(n.shortage for n in loads)
    if short > 0:
        if available < desired:
            return desired  # replicas asked for are still starting: count them first
        per = max(1, endpoints_per_replica)
        return max(bounds.min, min(bounds.max, desired + math.ceil(short / per)))
    if loads and all(n.idle for n in loads) and idle_for_s >= idle_s:
        return max(1, bounds.min)
    return desired

"""Replicas of the ``aggregator`` function for gateway tests that run without the runtime:
:class:`~bench.harness.aggregators.NodeAggregators` for a gateway run as a subprocess, and
:class:`Aggregators` for an in-process ``GatewayThread`` (endpoints read from its router).
"""

from __future__ import annotations

from pathlib import Path

from bench.harness.aggregators import NodeAggregators

__all__ = ["Aggregators", "NodeAggregators"]


class Aggregators(NodeAggregators):
    """Replicas registering with one in-process gateway's router (``gw``: a ``GatewayThread``)."""

    def __init__(self, gw, *, log_dir: Path | None = None) -> None:  # type: ignore[no-untyped-def]
        s = gw.settings
        super().__init__(s.node, s.socket_path(), log_dir or s.state_dir / "aggregators")
        self.gw = gw

    def start(self, n: int, endpoints: int = 1) -> None:
        """Spawn ``n`` replicas of ``endpoints`` endpoints each and wait until ``n * endpoints``
        endpoints are registered (all of theirs, where they are the first ones)."""
        self.spawn(n, endpoints=endpoints)
        self.wait_registered(n * endpoints)

    def endpoints(self) -> dict[int, int]:
        """Registered function endpoints: id -> pid."""
        return {
            eid: info.pid for eid, info in self.gw.gw.router.endpoints().items() if not info.local
        }

"""Replicas of the ``aggregator`` function for gateway tests that run without the runtime.

Each replica is started exactly as the embedded runtime starts one (``spawn_replica``: the
watchdog over ``functions/aggregator``, its own process group) with its node's router socket
in ``FEDFAAS_GATEWAY_ROUTER_SOCKET``; it registers job-agnostic and the gateway grants it jobs.
A replica started before its gateway listens (or while it restarts) keeps trying to register.

- :class:`Aggregators` serves an in-process ``GatewayThread`` (endpoints read from its router);
- :class:`NodeAggregators` serves a gateway run as a subprocess (``python -m gateway``),
  known by its node name, router socket and URL (endpoints read from ``GET /v1/router``).

Platform tests get their replicas from the runtime itself (``fedfaas up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from fedfaas.runtime.provider import node_env
from fedfaas.runtime.replicas import Replica, kill_now, spawn_replica, stop_replica

REPO = Path(__file__).resolve().parents[1]


class NodeAggregators:
    """Replicas registering with the router of one node gateway.

    Parameters
    ----------
    node
        The gateway's node name (``FEDFAAS_NODE`` of its replicas).
    router_socket
        Its router's registration socket (``GatewaySettings.socket_path()``).
    log_dir
        Where each replica's log goes (``aggregator-<slot>.log``).
    url
        The gateway's base URL, read for the registered endpoints (``GET /v1/router``).
    """

    def __init__(
        self, node: str, router_socket: Path, log_dir: Path, url: str | None = None
    ) -> None:
        self.node = node
        self.router_socket = router_socket
        self.log_dir = log_dir
        self.url = url
        self.replicas: list[Replica] = []
        self._next_slot = 0

    def spawn(self, n: int = 1, endpoints: int = 1) -> list[Replica]:
        """Start ``n`` replicas with ``endpoints`` endpoints each."""
        env = {
            **node_env(self.node, self.router_socket),
            "FEDFAAS_AGGREGATOR_ENDPOINTS": str(endpoints),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        new = []
        for _ in range(n):
            new.append(
                spawn_replica(
                    python=sys.executable,
                    function="aggregator",
                    function_dir=REPO / "functions" / "aggregator",
                    slot=self._next_slot,
                    generation=1,
                    env_vars=env,
                    env_process="",
                    log_dir=self.log_dir,
                    node=self.node,
                )
            )
            self._next_slot += 1
        self.replicas.extend(new)
        return new

    def endpoints(self) -> dict[int, int]:
        """Registered function endpoints (not the gateway's own): id -> pid."""
        if self.url is None:
            raise ValueError("endpoints of a subprocess gateway are read from its url; none given")
        try:
            r = httpx.get(f"{self.url}/v1/router", timeout=5)
            r.raise_for_status()
        except httpx.HTTPError:
            return {}  # not listening yet, or restarting
        return {int(e["id"]): int(e["pid"]) for e in r.json()["endpoints"] if not e["local"]}

    def wait_registered(self, n: int, timeout: float = 60) -> None:
        """Block until at least ``n`` function endpoints are registered."""
        deadline = time.monotonic() + timeout
        while len(self.endpoints()) < n:
            if time.monotonic() > deadline:
                dead = [r.instance for r in self.replicas if not r.alive()]
                raise TimeoutError(
                    f"{n} aggregator endpoints did not register with {self.node} in {timeout}s"
                    + (f" (exited: {', '.join(dead)}; logs in {self.log_dir})" if dead else "")
                )
            time.sleep(0.05)

    def kill_pid(self, pid: int) -> None:
        """SIGKILL a replica's process group (an endpoint's ``pid`` is its replica's)."""
        os.killpg(pid, signal.SIGKILL)

    def stop(self, grace: float = 10) -> None:
        """Stop every replica started here (SIGTERM, then SIGKILL after ``grace`` seconds)."""

        async def run() -> None:
            await asyncio.gather(*(stop_replica(r, grace) for r in self.replicas))

        asyncio.run(run())
        for r in self.replicas:
            if r.alive():
                kill_now(r)
        self.replicas.clear()

    def kill_all(self) -> None:
        """SIGKILL every replica's process group at once (cleanup after a failure)."""
        for r in self.replicas:
            with contextlib.suppress(Exception):
                kill_now(r)
        self.replicas.clear()


class Aggregators(NodeAggregators):
    """Replicas registering with one in-process gateway's router (``gw``: a ``GatewayThread``)."""

    def __init__(self, gw, log_dir: Path | None = None) -> None:  # type: ignore[no-untyped-def]
        s = gw.settings
        super().__init__(s.node, s.socket_path(), log_dir or s.state_dir / "aggregators")
        self.gw = gw

    def endpoints(self) -> dict[int, int]:
        """Registered function endpoints: id -> pid."""
        return {
            eid: info.pid for eid, info in self.gw.gw.router.endpoints().items() if not info.local
        }

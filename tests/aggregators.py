"""Replicas of the ``aggregator`` function for gateway tests that run without the runtime.

Each replica is started exactly as the embedded runtime starts one (``spawn_replica``: the
watchdog over ``functions/aggregator``, its own process group) with its node's router socket
in ``FEDFAAS_GATEWAY_ROUTER_SOCKET``; it registers job-agnostic and the gateway grants it jobs.
Platform tests get their replicas from the runtime itself (``fedfaas up``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from fedfaas.runtime.provider import node_env
from fedfaas.runtime.replicas import Replica, kill_now, spawn_replica, stop_replica

REPO = Path(__file__).resolve().parents[1]


class Aggregators:
    """Replicas registering with one gateway's router (``gw``: a ``GatewayThread``)."""

    def __init__(self, gw, log_dir: Path | None = None) -> None:  # type: ignore[no-untyped-def]
        self.gw = gw
        self.log_dir = log_dir or gw.settings.state_dir / "aggregators"
        self.replicas: list[Replica] = []

    def spawn(self, n: int = 1, endpoints: int = 1) -> list[Replica]:
        """Start ``n`` replicas with ``endpoints`` endpoints each."""
        env = {
            **node_env(self.gw.settings.node, self.gw.settings.socket_path()),
            "FEDFAAS_AGGREGATOR_ENDPOINTS": str(endpoints),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        new = [
            spawn_replica(
                python=sys.executable,
                function="aggregator",
                function_dir=REPO / "functions" / "aggregator",
                slot=len(self.replicas) + i,
                generation=1,
                env_vars=env,
                env_process="",
                log_dir=self.log_dir,
                node=self.gw.settings.node,
            )
            for i in range(n)
        ]
        self.replicas.extend(new)
        return new

    def endpoints(self) -> dict[int, int]:
        """Registered function endpoints: id -> pid."""
        return {
            eid: info.pid for eid, info in self.gw.gw.router.endpoints().items() if not info.local
        }

    def wait_registered(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.endpoints()) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} aggregator endpoints did not register")
            time.sleep(0.05)

    def kill_pid(self, pid: int) -> None:
        os.killpg(pid, signal.SIGKILL)

    def stop(self) -> None:
        async def run() -> None:
            await asyncio.gather(*(stop_replica(r, 10) for r in self.replicas))

        asyncio.run(run())
        for r in self.replicas:
            if r.alive():
                kill_now(r)
        self.replicas.clear()

"""Replicas of the ``aggregator`` function beside a node gateway run without the runtime, for
benchmarks and tests of the gateway alone (platform tests get theirs from ``fedfaas up``).

Each replica is started exactly as the embedded runtime starts one (``spawn_replica``: the
watchdog over ``functions/aggregator`` in its own process group, ``node_env`` naming the node
and its gateway's router socket, thread counts pinned); it registers job-agnostic and the
gateway grants it jobs. A replica started before its gateway listens (or while it restarts)
keeps trying to register. The replicas get a secrets folder holding a random function token
(``log_dir/secrets``), as the runtime's would (they refuse to start without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import httpx

from bench.runinfo import PINNED_THREADS, ROOT
from runtime.function_auth import TOKEN_SECRET
from runtime.provider import node_env
from runtime.replicas import Replica, kill_now, spawn_replica, stop_replica
from runtime.secrets import private_folder, write_file


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
    admin_secret_file
        The gateway's admin secret file: ``GET /v1/router`` needs its bearer token.
    """

    def __init__(
        self,
        node: str,
        router_socket: Path,
        log_dir: Path,
        url: str | None = None,
        admin_secret_file: Path | None = None,
    ) -> None:
        self.node = node
        self.router_socket = router_socket
        self.log_dir = log_dir
        self.url = url
        self.admin_secret_file = admin_secret_file
        self.replicas: list[Replica] = []
        self._next_slot = 0
        #: the replicas' function token (``Authorization: Bearer`` on their HTTP routes)
        self.token = secrets.token_urlsafe(24)
        self.secrets_dir = private_folder(log_dir / "secrets")
        write_file(self.secrets_dir, TOKEN_SECRET, self.token.encode())

    def spawn(
        self, n: int = 1, endpoints: int = 1, env: dict[str, str] | None = None
    ) -> list[Replica]:
        """Start ``n`` replicas with ``endpoints`` endpoints each (``env``: more settings)."""
        env = {
            **node_env(self.node, self.router_socket),
            **PINNED_THREADS,
            "FEDFAAS_AGGREGATOR_ENDPOINTS": str(endpoints),
            **(env or {}),
        }
        new = []
        for _ in range(n):
            new.append(
                spawn_replica(
                    python=sys.executable,
                    function="aggregator",
                    function_dir=ROOT / "functions" / "aggregator",
                    slot=self._next_slot,
                    generation=1,
                    env_vars=env,
                    env_process="",
                    log_dir=self.log_dir,
                    secrets_dir=self.secrets_dir,
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
            secret = self.admin_secret_file.read_text().strip() if self.admin_secret_file else ""
            r = httpx.get(
                f"{self.url}/v1/router", headers={"Authorization": f"Bearer {secret}"}, timeout=5
            )
            r.raise_for_status()
        except (httpx.HTTPError, FileNotFoundError):
            return {}  # not listening yet (its secret file not written yet), or restarting
        return {int(e["id"]): int(e["pid"]) for e in r.json()["endpoints"] if not e["local"]}

    def pids(self) -> list[int]:
        """The replicas' pids (each replica's endpoints register with its pid)."""
        return [r.pid for r in self.replicas if r.pid is not None]

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

"""The FedFaaS processes a benchmark starts: node gateways and ``aggregator`` replicas.

- :func:`start_gateway` runs ``python -m gateway`` with the command line that
  :meth:`gateway.settings.GatewaySettings.to_argv` renders (never written by hand).
- :class:`Replicas` starts replicas of the ``aggregator`` function exactly as the embedded
  runtime does (``spawn_replica``: the watchdog over ``functions/aggregator`` in its own process
  group, with ``node_env`` naming the node and its gateway's router socket). They register
  job-agnostic with that router and the gateway grants them jobs; no other way to aggregate
  exists.

Every process gets the pinned thread counts of :data:`bench.runinfo.PINNED_THREADS`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.aggregators import NodeAggregators
from bench.runinfo import PINNED_THREADS, ROOT
from gateway.settings import GatewaySettings


@dataclass
class GatewayProc:
    """A running ``python -m gateway`` (its own session: :meth:`stop` signals the group)."""

    settings: GatewaySettings
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"{self.settings.scheme}://{self.settings.host}:{self.settings.port}"

    def wait_ready(self, timeout: float = 90) -> None:
        from core.services import ServiceError, wait_for_port

        try:
            wait_for_port(self.settings.host, self.settings.port, timeout, self.proc)
        except ServiceError as exc:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise ServiceError(f"gateway {self.settings.node}: {exc}\n{tail}") from exc

    def secret(self) -> str:
        return self.settings.secret_path().read_text().strip()

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: router mode and reason among others."""
        import httpx

        return dict(httpx.get(f"{self.url}/healthz", timeout=10).json())

    def router(self) -> dict[str, Any]:
        """``GET /v1/router``: mode, endpoints with their metrics, drops."""
        import httpx

        headers = {"Authorization": f"Bearer {self.secret()}"}
        return dict(httpx.get(f"{self.url}/v1/router", headers=headers, timeout=10).json())

    def stop(self, grace: float = 20) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_gateway(
    settings: GatewaySettings,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    wait: bool = True,
    log_level: str = "WARNING",
) -> GatewayProc:
    """Start ``python -m gateway`` for ``settings``; output (and its JSON line) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **PINNED_THREADS, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            settings.to_argv(log_level=log_level),
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    gw = GatewayProc(settings, proc, log_path)
    if wait:
        try:
            gw.wait_ready()
        except BaseException:
            gw.stop()
            raise
    return gw


class Replicas(NodeAggregators):
    """Replicas of ``aggregator`` placed on one gateway's node, as the runtime places them."""

    def __init__(self, gateway: GatewayProc, log_dir: Path | None = None) -> None:
        s = gateway.settings
        super().__init__(
            s.node,
            s.socket_path(),
            log_dir or s.state_dir / "aggregators",
            url=gateway.url,
            admin_secret_file=s.secret_path(),
        )
        self.gateway = gateway

    def registered(self) -> int:
        """Function endpoints registered with the gateway's router (from ``/v1/router``)."""
        return len(self.endpoints())

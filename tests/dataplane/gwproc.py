"""A node gateway run as a subprocess (``python -m gateway``, its command line rendered by
``GatewaySettings.to_argv``) with warm ``aggregator`` replicas registered on its router."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.stack import GatewayProc, Replicas, start_gateway
from core import wire
from core.services import free_port
from gateway.settings import GatewaySettings
from tests.dataplane.gwutil import tiny_model


def gateway_settings(tmp_path: Path, redis_url: str, **settings: Any) -> GatewaySettings:
    """Node ``n1`` on a free port, state in ``tmp_path/gw``, a private store root in /dev/shm
    (the caller removes it), the userspace router; ``settings`` are more of its settings."""
    return GatewaySettings(
        node="n1",
        port=free_port(),
        state_dir=tmp_path / "gw",
        redis_url=redis_url,
        redis_credentials_file=redis_url.credentials_file("gateway"),  # type: ignore[attr-defined]
        shm_root=Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}",
        prefer_ebpf=False,
        **settings,
    )


def admin_settings(
    tmp_path: Path, redis_url: str, **settings: Any
) -> tuple[GatewaySettings, dict[str, str]]:
    """:func:`gateway_settings` with an admin secret of the test's own (``tmp_path/gw``, 0600),
    and the admin's bearer header: a gateway the test may stop and start again on the same
    state, store and Redis."""
    state = tmp_path / "gw"
    state.mkdir()
    secret = os.urandom(16).hex()
    (state / "admin-secret").write_text(secret + "\n")
    os.chmod(state / "admin-secret", 0o600)
    s = gateway_settings(tmp_path, redis_url, admin_secret_file=state / "admin-secret", **settings)
    return s, {"Authorization": f"Bearer {secret}"}


def post_job(
    url: str, admin: dict[str, str], clients: list[str], *, goal: int, rounds: int
) -> dict[str, str]:
    """``POST /v1/jobs`` of job ``j1`` (``tiny_model(0)``) as the admin: its clients' tokens."""
    r = httpx.post(
        url + "/v1/jobs",
        params={"job": "j1", "rounds": rounds, "goal": goal, "clients": ",".join(clients)},
        content=wire.encode_tensors(tiny_model(0)),
        headers=admin,
    )
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def journal_retries(url: str, admin: dict[str, str], op: str) -> float:
    """The gateway's ``fedfaas_gateway_journal_retries_total{op}``, read from its /metrics."""
    text = httpx.get(url + "/metrics", headers=admin).text
    line = f'fedfaas_gateway_journal_retries_total{{op="{op}"}} '
    return next((float(x[len(line) :]) for x in text.splitlines() if x.startswith(line)), 0.0)


@contextmanager
def gateway_process(
    tmp_path: Path, redis_url: str, *, endpoints: int = 2, **settings: Any
) -> Iterator[tuple[GatewayProc, str]]:
    """Yield ``(gateway, admin secret)``: node ``n1``, userspace router, a private store root,
    one replica with ``endpoints`` endpoints registered; ``settings`` are more of its settings.
    Everything is stopped and the store root removed afterwards."""
    s, header = admin_settings(tmp_path, redis_url, **settings)
    admin = header["Authorization"].removeprefix("Bearer ")
    shm = s.shm_root
    gw = start_gateway(s, tmp_path / "gateway.log")
    aggs = Replicas(gw, tmp_path / "aggregators")
    try:
        aggs.spawn(1, endpoints=endpoints)
        aggs.wait_registered(endpoints)
        yield gw, admin
    finally:
        gw.stop()
        aggs.stop()
        shutil.rmtree(shm, ignore_errors=True)

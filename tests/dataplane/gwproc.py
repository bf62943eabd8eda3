"""A node gateway run as a subprocess (``python -m gateway``, its command line rendered by
``GatewaySettings.to_argv``) with warm ``aggregator`` replicas registered on its router."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.stack import GatewayProc, Replicas, start_gateway
from fedfaas.services import free_port
from gateway.settings import GatewaySettings


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


@contextmanager
def gateway_process(
    tmp_path: Path, redis_url: str, *, endpoints: int = 2, **settings: Any
) -> Iterator[tuple[GatewayProc, str]]:
    """Yield ``(gateway, admin secret)``: node ``n1``, userspace router, a private store root,
    one replica with ``endpoints`` endpoints registered; ``settings`` are more of its settings.
    Everything is stopped and the store root removed afterwards."""
    state = tmp_path / "gw"
    state.mkdir()
    admin = os.urandom(16).hex()
    (state / "admin-secret").write_text(admin + "\n")
    os.chmod(state / "admin-secret", 0o600)
    s = gateway_settings(tmp_path, redis_url, admin_secret_file=state / "admin-secret", **settings)
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

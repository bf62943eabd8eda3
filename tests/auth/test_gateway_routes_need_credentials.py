"""Every node gateway route but ``/healthz`` needs a credential, on a real gateway process.

Walks the gateway's FastAPI route table (a route added later without a check fails here) plus
its native routes (client uploads, partials between nodes) and sends each one no credential, a
wrong one, the token of a client of another job and, on admin routes, a client token of the
job itself: every answer is 401 or 403 with a JSON ``{"error", "detail"}``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from bench.stack import GatewayProc, start_gateway
from client.sdk import create_job
from gateway.api import build_app
from tests.dataplane.gwproc import gateway_settings
from tests.dataplane.gwutil import tiny_bytes

pytestmark = pytest.mark.integration

OPEN = {"/healthz"}
#: routes a client token of the job opens (the SDK polls the job and fetches its model)
CLIENT_READS = {"/v1/jobs/{job}", "/v1/jobs/{job}/model"}
#: the native exchanges (not in the FastAPI table)
NATIVE = [
    ("POST", "/v1/jobs/{job}/rounds/{number}/updates"),
    ("POST", "/v1/internal/jobs/{job}/rounds/{number}/partials?slot=2"),
]


def _routes() -> list[tuple[str, str]]:
    app = build_app(object())  # type: ignore[arg-type] # the table only: no route runs
    assert all(isinstance(r, APIRoute) for r in app.routes), "no docs or schema routes"
    return sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods)


@pytest.fixture()
def gateway_extra() -> dict[str, Any]:
    """More settings of the gateway (none here; tests/tls adds TLS's)."""
    return {}


@pytest.fixture()
def gateway(
    tmp_path: Path, redis_url: str, gateway_extra: dict[str, Any]
) -> Iterator[tuple[GatewayProc, dict[str, Any]]]:
    """A gateway process with jobs ``ja`` (clients c0, c1) and ``jb`` (client c0)."""
    secret = tmp_path / "admin-secret"
    secret.write_text(os.urandom(16).hex())
    secret.chmod(0o600)
    s = gateway_settings(tmp_path, redis_url, admin_secret_file=secret, **gateway_extra)
    gw = start_gateway(s, tmp_path / "gateway.log")
    try:
        admin = gw.secret()
        ja = create_job(gw.url, admin, "ja", tiny_bytes(0), rounds=1, goal=2, clients=["c0", "c1"])
        jb = create_job(gw.url, admin, "jb", tiny_bytes(0), rounds=1, goal=1, clients=["c0"])
        yield gw, {"admin": admin, "ja": ja.tokens, "jb": jb.tokens}
    finally:
        gw.stop()
        shutil.rmtree(s.shm_root, ignore_errors=True)


def _send(url: str, method: str, path: str, token: str | None) -> httpx.Response:
    path = re.sub(r"\{job\}", "ja", path)
    path = re.sub(r"\{number\}", "1", path)
    path = re.sub(r"\{client\}", "c1", path)
    if path.startswith("/v1/jobs?") or (method == "POST" and path == "/v1/jobs"):
        path += "?job=jc&rounds=1&goal=1&clients=c0"
    headers = {"X-Client-Id": "c0", "X-Sample-Count": "1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = tiny_bytes(1) if method in ("POST", "PUT") else None
    return httpx.request(method, url + path, headers=headers, content=body, timeout=30)


def _refused(r: httpx.Response, what: str) -> None:
    assert r.status_code in (401, 403), f"{what}: {r.status_code} {r.text[:200]}"
    body = r.json()
    assert body["error"] and body["detail"], what


def test_every_route_but_healthz_refuses_missing_wrong_and_foreign_credentials(
    gateway: tuple[GatewayProc, dict[str, Any]],
) -> None:
    gw, creds = gateway
    routes = [*_routes(), *NATIVE]
    assert ("GET", "/metrics") in routes and ("GET", "/v1/router") in routes
    for method, path in routes:
        if path in OPEN:
            continue
        what = f"{method} {path}"
        _refused(_send(gw.url, method, path, None), f"{what}, no credential")
        _refused(_send(gw.url, method, path, "0" * 64), f"{what}, a wrong token")
        _refused(_send(gw.url, method, path, creds["jb"]["c0"]), f"{what}, another job's client")
        if path not in CLIENT_READS and "/updates" not in path:
            _refused(_send(gw.url, method, path, creds["ja"]["c0"]), f"{what}, a client token")
    assert httpx.get(gw.url + "/healthz").status_code == 200
    # nothing was created, deleted or uploaded by the refused requests
    admin = {"Authorization": f"Bearer {creds['admin']}"}
    jobs = httpx.get(gw.url + "/v1/jobs", headers=admin).json()["jobs"]
    assert sorted(j["job"] for j in jobs) == ["ja", "jb"]
    assert all(j["received"] == 0 for j in jobs)


def test_the_right_credentials_open_the_routes(gateway: tuple[GatewayProc, dict[str, Any]]) -> None:
    gw, creds = gateway
    admin = {"Authorization": f"Bearer {creds['admin']}"}
    client = {"Authorization": f"Bearer {creds['ja']['c0']}"}
    metrics = httpx.get(gw.url + "/metrics", headers=admin)
    assert metrics.status_code == 200 and "fedfaas" in metrics.text
    assert "endpoints" in httpx.get(gw.url + "/v1/router", headers=admin).json()
    as_client = httpx.get(gw.url + "/v1/jobs/ja", headers=client).json()
    assert as_client["version"] == 0 and "store" not in as_client and "salt" not in as_client
    as_admin = httpx.get(gw.url + "/v1/jobs/ja", headers=admin).json()
    assert as_admin["store"] and len(as_admin["salt"]) == 32 and as_admin["revoked"] == []
    assert httpx.get(gw.url + "/v1/jobs/ja/model", headers=client).status_code == 200
    # a caller without a credential cannot tell which jobs exist; the admin can
    assert httpx.get(gw.url + "/v1/jobs/nope").status_code == 401
    assert httpx.get(gw.url + "/v1/jobs/nope", headers=client).status_code == 401
    assert httpx.get(gw.url + "/v1/jobs/nope", headers=admin).json()["error"] == "unknown_job"

"""The FastAPI services over TLS, each a real process served by core.shutdown.serve: the control
plane, the cache engine and the request tracker. For each: the route walk of tests/auth over
HTTPS, plain HTTP to its port (a clear 400), a client certificate from another CA; and a key file others can
read stops a service at start."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from core.auth import Scope, bearer
from core.cmdline import CommandLineSettings
from core.services import free_port
from core.tls import TlsFiles, client_context
from request_tracker.settings import TrackerSettings
from tests.auth.test_routes_need_credentials import (
    OPEN,
    SERVICES,
    _assert_refused,
    _tokens,
)
from tests.tls.certs import Certs, assert_plain_http_refused, mint, running, settings_of
from tests.tls.test_gateway_tls import _tls_get

pytestmark = pytest.mark.integration

Build = Callable[[dict[Scope, Path], Any, dict[str, Any]], CommandLineSettings]


def _control(t: dict[Scope, Path], request: Any, tls: dict[str, Any]) -> CommandLineSettings:
    return ControlPlaneSettings(
        port=free_port(),
        gateways="n1=https://127.0.0.1:1",
        admin_token_file=t[Scope.ADMIN],
        analyst_token_file=t[Scope.ANALYST],
        stop_grace=5,
        **tls,
    )


def _tracker(t: dict[Scope, Path], request: Any, tls: dict[str, Any]) -> CommandLineSettings:
    redis = request.getfixturevalue("redis_url")
    return TrackerSettings(
        port=free_port(),
        redis_url=str(redis),
        redis_credentials_file=redis.credentials_file("request-tracker"),
        admin_token_file=t[Scope.ADMIN],
        analyst_token_file=t[Scope.ANALYST],
        function_token_file=t[Scope.SERVICE],
        stop_grace=5,
        **tls,
    )


def _engine(t: dict[Scope, Path], request: Any, tls: dict[str, Any]) -> CommandLineSettings:
    redis = request.getfixturevalue("redis_url")
    minio = request.getfixturevalue("minio_server")
    return EngineSettings(
        port=free_port(),
        redis_url=str(redis),
        redis_credentials_file=redis.credentials_file("cache-engine"),
        minio_endpoint=minio.endpoint,
        minio_credentials_file=minio.credentials_file("cache-engine"),
        admin_token_file=t[Scope.ADMIN],
        service_token_file=t[Scope.SERVICE],
        function_token_file=t[Scope.SERVICE],
        stop_grace=5,
        **tls,
    )


BUILD: dict[str, Build] = {"control_plane": _control, "tracker": _tracker, "cache_engine": _engine}


@pytest.fixture(params=list(BUILD))
def service(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str, Certs, dict[Scope, Path]]]:
    """``(name, https URL, certificates, token files)`` of a running service."""
    certs = mint(tmp_path / "pki")
    tokens = _tokens(tmp_path)
    s = BUILD[request.param](tokens, request, settings_of(certs.server))
    host, port = s.host, s.port  # type: ignore[attr-defined]
    with running(s.to_argv(), host, port, tmp_path / "service.log"):
        yield request.param, f"https://{host}:{port}", certs, tokens


def test_every_route_but_healthz_refuses_missing_and_wrong_credentials_over_tls(
    service: tuple[str, str, Certs, dict[Scope, Path]],
) -> None:
    name, url, certs, tokens = service
    with httpx.Client(base_url=url, verify=client_context(certs.ca.cert), timeout=30) as http:
        walked = 0
        for r in SERVICES[name](tokens).routes:
            path = getattr(r, "path", "")
            if path in OPEN:
                continue
            for method in sorted(getattr(r, "methods", None) or {"GET"}):
                target = re.sub(r"\{[^}]+\}", "x", path) + "?client=c"
                _assert_refused(http.request(method, target), 401)
                _assert_refused(http.request(method, target, headers=bearer("wrong")), 401)
                walked += 1
        assert walked >= 3, name
        admin = bearer(tokens[Scope.ADMIN].read_text().strip())
        assert http.get("/metrics", headers=admin).status_code == 200


def test_plain_http_to_the_tls_port_is_a_clear_400(
    service: tuple[str, str, Certs, dict[Scope, Path]],
) -> None:
    """Plain HTTP on a TLS port is answered a 400 ``tls_required`` naming the https address,
    as on a node gateway (tests/tls/test_gateway_tls), not a dropped connection."""
    _, url, certs, _ = service
    assert_plain_http_refused(url, "/metrics")
    assert httpx.get(url + "/metrics", verify=client_context(certs.ca.cert)).status_code == 401


def test_a_client_certificate_from_another_ca_is_refused(
    service: tuple[str, str, Certs, dict[Scope, Path]],
) -> None:
    _, url, certs, _ = service
    port = int(url.rsplit(":", 1)[1])
    stranger = TlsFiles(certs.stranger.cert, certs.stranger.key, certs.ca.cert)
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(port, stranger.client_context())
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/metrics", verify=stranger.client_context())
    assert _tls_get(port, certs.client.client_context()).startswith(b"HTTP/1.1 ")


@pytest.mark.parametrize("name", list(BUILD))
def test_a_key_file_others_can_read_stops_the_service_at_start(
    tmp_path: Path, request: pytest.FixtureRequest, name: str
) -> None:
    certs = mint(tmp_path / "pki")
    certs.server.key.chmod(0o640)
    s = BUILD[name](_tokens(tmp_path), request, settings_of(certs.server))
    done = subprocess.run(s.to_argv(), capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"readable by others" in done.stderr

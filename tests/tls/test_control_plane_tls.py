"""The control plane (a real ``python -m control_plane``, uvicorn through core.shutdown.serve)
over TLS: its route walk over HTTPS, plain HTTP to its port, a client certificate from another
CA, and a key file others can read."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from control_plane.settings import ControlPlaneSettings
from core.auth import Scope, bearer
from core.services import free_port, wait_for_port
from core.tls import TlsFiles, client_context
from tests.auth.test_routes_need_credentials import OPEN, _assert_refused, _control, _tokens
from tests.tls.certs import Certs, mint
from tests.tls.test_gateway_tls import _tls_get

pytestmark = pytest.mark.integration


def _settings(tmp_path: Path, certs: Certs, tokens: dict[Scope, Path]) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        port=free_port(),
        gateways="n1=https://127.0.0.1:1",
        admin_token_file=tokens[Scope.ADMIN],
        analyst_token_file=tokens[Scope.ANALYST],
        tls_cert_file=certs.server.cert,
        tls_key_file=certs.server.key,
        tls_ca_file=certs.ca.cert,
        stop_grace=5,
    )


@pytest.fixture()
def control(tmp_path: Path) -> Iterator[tuple[str, Certs, dict[Scope, Path]]]:
    certs = mint(tmp_path / "pki")
    tokens = _tokens(tmp_path)
    s = _settings(tmp_path, certs, tokens)
    log = open(tmp_path / "control.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(s.to_argv(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(s.host, s.port, 60, proc)
        yield f"https://{s.host}:{s.port}", certs, tokens
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_every_route_but_healthz_refuses_missing_and_wrong_credentials_over_tls(
    control: tuple[str, Certs, dict[Scope, Path]],
) -> None:
    url, certs, tokens = control
    with httpx.Client(base_url=url, verify=client_context(certs.ca.cert)) as http:
        assert http.get("/healthz").status_code == 200
        walked = 0
        for r in _control(tokens).routes:
            path = getattr(r, "path", "")
            if path in OPEN:
                continue
            for method in sorted(getattr(r, "methods", None) or {"GET"}):
                target = re.sub(r"\{[^}]+\}", "x", path) + "?client=c"
                _assert_refused(http.request(method, target), 401)
                _assert_refused(http.request(method, target, headers=bearer("wrong")), 401)
                walked += 1
        assert walked > 10
        admin = bearer(tokens[Scope.ADMIN].read_text().strip())
        assert http.get("/metrics", headers=admin).status_code == 200


def test_plain_http_to_the_tls_port_gets_no_answer(
    control: tuple[str, Certs, dict[Scope, Path]],
) -> None:
    """uvicorn answers nothing to plain HTTP on a TLS port: the client sees the server close
    the connection (the node gateway's own server answers a 400, tests/tls/test_gateway_tls)."""
    url, certs, _ = control
    with pytest.raises(httpx.RemoteProtocolError, match="disconnected without sending"):
        httpx.get(url.replace("https://", "http://") + "/healthz")
    assert httpx.get(url + "/healthz", verify=client_context(certs.ca.cert)).status_code == 200


def test_a_client_certificate_from_another_ca_is_refused(
    control: tuple[str, Certs, dict[Scope, Path]],
) -> None:
    url, certs, _ = control
    port = int(url.rsplit(":", 1)[1])
    stranger = TlsFiles(certs.stranger.cert, certs.stranger.key, certs.ca.cert)
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(port, stranger.client_context())
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/healthz", verify=stranger.client_context())
    assert _tls_get(port, certs.client.client_context()).startswith(b"HTTP/1.1 200")


def test_a_key_file_others_can_read_stops_the_service_at_start(tmp_path: Path) -> None:
    certs = mint(tmp_path / "pki")
    certs.server.key.chmod(0o640)
    s = _settings(tmp_path, certs, _tokens(tmp_path))
    done = subprocess.run(s.to_argv(), capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"readable by others" in done.stderr

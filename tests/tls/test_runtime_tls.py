"""The embedded runtime (a real ``python -m runtime``) over TLS: the walk of its ``/system``
routes from tests/auth over HTTPS, plain HTTP to its port, a client certificate from another
CA."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.tls import TlsFiles, client_context
from runtime import RuntimeProcess
from tests.auth.test_runtime_and_function_routes import BASIC_AUTH_OUTSIDE, WRONG, _routes
from tests.runtime.conftest import STACK
from tests.tls.certs import Certs, assert_plain_http_refused, mint
from tests.tls.test_gateway_tls import _tls_get

pytestmark = pytest.mark.integration


@pytest.fixture()
def runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RuntimeProcess, Certs]]:
    certs = mint(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca.cert))  # RuntimeProcess's health probe
    tls = {
        "tls_cert_file": certs.server.cert,
        "tls_key_file": certs.server.key,
        "tls_ca_file": certs.ca.cert,
    }
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt", settings=tls).start()
    try:
        assert rt.url.startswith("https://")
        yield rt, certs
    finally:
        rt.stop()


def test_every_system_route_refuses_missing_and_wrong_credentials_over_tls(
    runtime: tuple[RuntimeProcess, Certs],
) -> None:
    rt, certs = runtime
    walked = 0
    with httpx.Client(base_url=rt.url, verify=client_context(certs.ca.cert), timeout=30) as http:
        for method, path in _routes():
            if not (path.startswith("/system") or path in BASIC_AUTH_OUTSIDE):
                continue
            for what, headers in WRONG.items():
                r = http.request(method, path, headers=headers, content=b'{"name": "x"}')
                assert r.status_code == 401, (what, method, path, r.status_code)
            ok = http.request(method, path, auth=rt.auth, content=b'{"name": "x"}')
            assert ok.status_code != 401, (method, path)
            walked += 1
        assert walked > 10
        assert http.get("/system/functions", auth=rt.auth).status_code == 200


def test_plain_http_gets_a_clear_400_and_another_ca_s_client_certificate_no_answer(
    runtime: tuple[RuntimeProcess, Certs],
) -> None:
    rt, certs = runtime
    assert_plain_http_refused(rt.url)
    assert_plain_http_refused(rt.url, "/function/echo")  # an invocation's body: not read
    stranger = TlsFiles(certs.stranger.cert, certs.stranger.key, certs.ca.cert)
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(rt.port, stranger.client_context())
    assert _tls_get(rt.port, certs.client.client_context()).startswith(b"HTTP/1.1 200")

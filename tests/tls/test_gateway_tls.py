"""The node gateway over TLS, on real gateways: the credential route walk and the upload
bad-input tests (the very tests of tests/auth and tests/dataplane, collected here against a TLS
gateway), plain HTTP to the TLS port, and client certificates from another CA.

The clients (httpx, the SDK's ``create_job``) verify the gateway against the platform's CA
through ``SSL_CERT_FILE``, as a user of the SDK would.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Any

import httpx
import pytest

from bench.stack import GatewayProc
from core.tls import TlsFiles, client_context
from tests.auth.test_gateway_routes_need_credentials import (
    gateway,
    test_every_route_but_healthz_refuses_missing_wrong_and_foreign_credentials,
    test_the_right_credentials_open_the_routes,
)
from tests.dataplane.gateways import make_gw
from tests.dataplane.gwutil import GatewayThread, tiny_bytes
from tests.dataplane.test_gateway_ingest import (
    job,
    test_bad_body_is_a_clear_4xx_that_leaves_store_and_round_unchanged,
    test_bad_request_metadata_is_refused_before_the_body,
    test_unknown_client_and_other_clients_token_are_refused,
    upload,
)
from tests.dataplane.test_gateway_rounds import (
    test_two_nodes_send_one_partial_across_and_agree_with_flat_fedavg,
)
from tests.tls.certs import Certs, certs, settings_of

pytestmark = pytest.mark.integration

#: the tests of tests/auth and tests/dataplane that run here again, over TLS, with the fixtures
#: they need (``gateway_extra`` below turns TLS on in them)
OVER_TLS = [
    certs,
    gateway,
    make_gw,
    test_every_route_but_healthz_refuses_missing_wrong_and_foreign_credentials,
    test_the_right_credentials_open_the_routes,
    test_bad_body_is_a_clear_4xx_that_leaves_store_and_round_unchanged,
    test_bad_request_metadata_is_refused_before_the_body,
    test_unknown_client_and_other_clients_token_are_refused,
    job,
    # the partial crosses from node b to the root a over TLS, b verifying a's certificate
    # against the platform's CA and presenting its own
    test_two_nodes_send_one_partial_across_and_agree_with_flat_fedavg,
]


@pytest.fixture()
def gateway_extra(certs: Certs) -> dict[str, Any]:
    """Every gateway here (the route walk's, ``make_gw``'s) serves TLS."""
    return settings_of(certs.server)


@pytest.fixture()
def gw(make_gw: Any) -> GatewayThread:
    """The bad-input tests' gateway (tests/dataplane/test_gateway_ingest), serving TLS."""
    g: GatewayThread = make_gw(max_header=4096, max_inflight=0)
    assert g.url.startswith("https://")
    return g


def test_plain_http_to_the_tls_port_is_a_clear_400(gw: GatewayThread, job: dict[str, str]) -> None:
    assert gw.gw is not None
    plain = f"http://127.0.0.1:{gw.gw.port}"
    r = httpx.get(plain + "/healthz")
    assert r.status_code == 400
    assert r.json()["error"] == "tls_required"
    assert f"https://127.0.0.1:{gw.gw.port}/" in r.json()["detail"]
    # an upload sent in the clear is refused the same way, its body never read
    r = httpx.post(
        plain + "/v1/jobs/j1/rounds/1/updates",
        content=tiny_bytes(1),
        headers={"X-Client-Id": "c1", "X-Sample-Count": "1", "Authorization": "Bearer x"},
    )
    assert r.status_code == 400 and r.json()["error"] == "tls_required"
    assert upload(gw, job, "c1", tiny_bytes(1)).status_code == 202  # HTTPS still works


def _tls_get(port: int, ctx: ssl.SSLContext) -> bytes:
    """``GET /healthz`` on a TLS socket: the answer's status line (an end without TLS's close is an
    :class:`ssl.SSLEOFError`, not an empty answer)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False) as s:
        # TLS 1.3: the server judges the client's certificate after the client's handshake
        # ends, so a refusal arrives on the first read
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with s.makefile("rb") as answer:
            return answer.readline()  # the status line


def _refusals_logged(caplog: pytest.LogCaptureFixture, wait_s: float = 10.0) -> list[str]:
    """The gateway's "handshake refused" lines, waited for: the server sends its alert before its
    handshake call returns and logs, so the client can see the refusal before the gateway's thread
    has written the line (CI at 6b510e2 read the records in that gap and found none)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [r.getMessage() for r in caplog.records if "handshake refused" in r.getMessage()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_a_client_certificate_from_another_ca_is_refused_at_the_handshake(
    gw: GatewayThread, job: dict[str, str], certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    assert gw.gw is not None
    stranger = TlsFiles(certs.stranger.cert, certs.stranger.key, certs.ca.cert)
    caplog.set_level(logging.INFO, logger="core.tls_front")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        _tls_get(gw.gw.port, stranger.client_context())
    refusals = _refusals_logged(caplog)
    assert refusals and "certificate" in refusals[0].lower(), refusals
    # the same through httpx: a transport error, never an answer
    with pytest.raises(httpx.TransportError):
        httpx.get(gw.url + "/healthz", verify=stranger.client_context())
    # a part of the platform (a certificate the CA signed) and a client without one get in
    assert _tls_get(gw.gw.port, certs.client.client_context()).startswith(b"HTTP/1.1 200")
    assert httpx.get(gw.url + "/healthz").status_code == 200


def test_a_client_that_does_not_trust_the_platform_ca_refuses_the_gateway(
    gw: GatewayThread, certs: Certs
) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(gw.url + "/healthz", verify=client_context(certs.stranger.ca))
    assert httpx.get(gw.url + "/healthz").status_code == 200  # the gateway kept serving


def test_with_required_client_certificates_only_the_platform_s_parts_get_in(
    make_gw: Any, certs: Certs
) -> None:
    """mTLS: a gateway that requires client certificates refuses a client without one, and
    lets in a gateway's own peer client (which presents the gateway's certificate)."""
    g = make_gw(tls_client_certs="required")
    with pytest.raises(httpx.TransportError):
        httpx.get(g.url + "/healthz")
    assert g.gw is not None and g._loop is not None
    asked = asyncio.run_coroutine_threadsafe(g.gw.peers.get(g.url + "/healthz"), g._loop)
    assert asked.result(30).status_code == 200


def test_the_collected_tests_run_against_tls_gateways(
    gateway: tuple[GatewayProc, dict[str, Any]], gw: GatewayThread
) -> None:
    assert gateway[0].url.startswith("https://") and gw.url.startswith("https://")
    with pytest.raises(httpx.HTTPStatusError):  # the route walk's gateway refuses plain HTTP
        httpx.get(gateway[0].url.replace("https", "http", 1) + "/healthz").raise_for_status()

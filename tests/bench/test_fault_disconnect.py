"""Fault (l)'s broken-off upload (:func:`bench.fault_disconnect.broken_off`) on a real node
gateway, over TLS (``fedfaas up``'s default) and plain HTTP: the gateway sees the body end early
and answers 400 ``truncated_body``, which the client reads; the client's buffer is given back
and its real upload is taken after it. Over TLS a bare TCP half-close gets no answer at all
(asyncio's TLS layer drops it): the harness's TLS half-close (``close_notify``) is what makes the
row's evidence, the answers, readable on the platform users get."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import httpx
import pytest

from bench.fault_disconnect import answer_code, broken_off
from core.tls import client_context
from tests.dataplane.gateways import make_gw
from tests.dataplane.gwutil import GatewayThread, tiny_bytes
from tests.tls.certs import Certs, certs, settings_of

pytestmark = pytest.mark.integration

__all__ = ["certs", "make_gw"]  # fixtures used by name

CLIENTS = ["c0", "c1"]


@pytest.fixture(params=["tls", "plain"])
def gateway_extra(request: pytest.FixtureRequest, certs: Certs) -> dict[str, Any]:
    """The gateway of :func:`make_gw` serves TLS (the platform's default) or plain HTTP."""
    return settings_of(certs.server) if request.param == "tls" else {}


@pytest.fixture()
def gw(make_gw: Any) -> GatewayThread:
    g: GatewayThread = make_gw()
    return g


def _job(gw: GatewayThread, verify: ssl.SSLContext | bool) -> dict[str, str]:
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 2, "clients": ",".join(CLIENTS)},
        content=tiny_bytes(0),
        headers={"Authorization": f"Bearer {gw.gw.secret}"},  # type: ignore[union-attr]
        verify=verify,
    )
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def _head(gw: GatewayThread, token: str, client: str, length: int) -> bytes:
    return (
        f"POST /v1/jobs/j1/rounds/1/updates HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nX-Client-Id: {client}\r\n"
        f"X-Sample-Count: 3\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_broken_off_upload_is_answered_truncated_body_and_the_real_one_then_taken(
    gw: GatewayThread, certs: Certs
) -> None:
    tls = gw.url.startswith("https://")
    ctx = client_context(certs.ca.cert) if tls else None
    tokens = _job(gw, ctx or True)
    body = tiny_bytes(1)
    head = _head(gw, tokens["c0"], "c0", len(body))
    for _ in range(3):  # the buffer each one took is given back: the next gets one again
        assert broken_off(gw.url, head, body[: len(body) // 2], ctx) == "truncated_body"
    r = httpx.post(
        f"{gw.url}/v1/jobs/j1/rounds/1/updates",
        content=body,
        headers={
            "Authorization": f"Bearer {tokens['c0']}",
            "X-Client-Id": "c0",
            "X-Sample-Count": "3",
        },
        verify=ctx or True,
    )
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("gateway_extra", ["tls"], indirect=True)
def test_over_tls_a_bare_tcp_half_close_gets_no_answer(gw: GatewayThread, certs: Certs) -> None:
    """Why the harness sends ``close_notify``: the answer to a TCP half-close under TLS is
    dropped with the connection (the gateway still sees the body end; see the module)."""
    assert gw.url.startswith("https://")
    ctx = client_context(certs.ca.cert)
    tokens = _job(gw, ctx)
    body = tiny_bytes(1)
    head = _head(gw, tokens["c0"], "c0", len(body))
    with socket.create_connection(("127.0.0.1", gw.gw.port), timeout=30) as raw:  # type: ignore[union-attr]
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        s.sendall(head + body[: len(body) // 2])
        socket.socket.shutdown(s, socket.SHUT_WR)  # TCP's half-close, TLS left open
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (ssl.SSLError, OSError):
            pass
    assert answer_code(data) == "none", data[:200]


def test_an_https_url_without_the_platform_s_ca_is_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="give the platform's CA"):
        broken_off("https://127.0.0.1:1", b"", b"", None)

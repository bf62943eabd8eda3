"""mTLS between the platform's own parts on a node gateway (issue 41): over TLS, the routes that
only the platform's parts call (:mod:`gateway.callers`) need a client certificate the platform's
CA signed as well as the admin secret.

An SDK-like caller (the platform's CA trusted, no certificate of its own) with the right admin
secret gets 403 ``client_certificate_required`` on every internal route, answered before its body
is read and logged; with a platform certificate the same calls reach the routes; the control
plane's gateway client presents its certificate; ``tls_internal_names`` narrows the certificates
taken; ``tls_client_certs="none"`` leaves the admin secret alone, with a warning. The route map
is the gateway's whole route table, so a new route has to be placed in it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from control_plane.coordinator import Coordinator
from control_plane.errors import GatewayError as GatewayCallFailed
from control_plane.settings import ControlPlaneSettings
from core.tls import client_context, mint_cert
from gateway.api import build_app
from gateway.callers import ROUTES, internal_route, parse_names
from gateway.ingest import PARTIAL, UPLOAD
from tests.dataplane.gateways import make_gw
from tests.dataplane.gwutil import GatewayThread, tiny_bytes
from tests.tls.certs import Certs, certs, settings_of

#: fixtures imported for the tests here (with ``gateway_extra`` below, turning TLS on)
FIXTURES = [make_gw, certs]

JOB = "j1"
CLIENTS = ["c0", "c1", "c2"]
#: the native exchanges' routes (not in the FastAPI table), each with the pattern that routes it
NATIVE = {
    ("POST", "/v1/jobs/{job}/rounds/{number}/updates"): UPLOAD,
    ("POST", "/v1/internal/jobs/{job}/rounds/{number}/partials"): PARTIAL,
}
HOSTS = ["127.0.0.1", "localhost"]


def _fill(path: str) -> str:
    return path.replace("{job}", JOB).replace("{number}", "1").replace("{client}", "c1")


# -- the route map -----------------------------------------------------------------------------
def test_the_route_map_places_every_route_of_the_gateway() -> None:
    app = build_app(object())  # type: ignore[arg-type]  # the table only: no route runs
    table = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()}
    for (method, path), pattern in NATIVE.items():
        assert pattern.match(_fill(path)), path
        table.add((method, path))
    assert {(r.method, r.path) for r in ROUTES} == table
    internal = {(r.method, r.path) for r in ROUTES if r.internal}
    assert internal == {
        ("POST", "/v1/internal/jobs/{job}/rounds/{number}/partials"),
        ("PUT", "/v1/jobs/{job}/rounds/{number}/plan"),
        ("POST", "/v1/jobs/{job}/rounds/{number}/close"),
        ("POST", "/v1/jobs/{job}/adopt"),
        ("GET", "/v1/jobs/{job}/rounds/{number}/unmask"),
        ("POST", "/v1/jobs/{job}/rounds/{number}/unmask"),
        ("DELETE", "/v1/jobs/{job}"),
        ("DELETE", "/v1/jobs/{job}/clients/{client}"),
    }


def test_a_request_is_matched_to_its_route_as_the_app_routes_it() -> None:
    assert internal_route("PUT", "/v1/jobs/j1/rounds/3/plan") is not None
    # the app routes the decoded path: an encoded one is the same route
    assert internal_route("PUT", "/v1/jobs/j1/rounds/3/pl%61n") is not None
    assert internal_route("HEAD", "/v1/jobs/j1/rounds/3/unmask") is not None
    assert internal_route("DELETE", "/v1/jobs/j1") is not None
    # the SDK's routes and the operator's are not internal
    for method, path in [
        ("GET", "/v1/jobs/j1"),
        ("GET", "/v1/jobs/j1/model"),
        ("POST", "/v1/jobs/j1/rounds/3/updates"),
        ("POST", "/v1/jobs"),
        ("GET", "/metrics"),
        ("GET", "/v1/jobs/j1/rounds/3/plan/x"),
    ]:
        assert internal_route(method, path) is None, (method, path)
    assert parse_names(" control-plane, gateway-node0,,") == {"control-plane", "gateway-node0"}


# -- on a TLS gateway ----------------------------------------------------------------------------
@pytest.fixture()
def gateway_extra(certs: Certs) -> dict[str, Any]:
    return settings_of(certs.server)


def _with_job(g: GatewayThread) -> dict[str, str]:
    """Job ``j1`` created as the SDK does (admin secret, no certificate: not an internal route),
    and c0's update of round 1 (a round closes only with updates to aggregate)."""
    assert g.gw is not None and g.url.startswith("https://")
    r = httpx.post(
        g.url + "/v1/jobs",
        params={"job": JOB, "rounds": 2, "goal": 3, "clients": ",".join(CLIENTS)},
        content=tiny_bytes(0),
        headers={"Authorization": f"Bearer {g.gw.secret}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    _upload(g, "c0", r.json()["tokens"]["c0"])
    return {"Authorization": f"Bearer {g.gw.secret}"}


def _upload(g: GatewayThread, client: str, token: str) -> None:
    """One update of round 1, as the SDK sends it (a client token, no certificate)."""
    r = httpx.post(
        g.url + f"/v1/jobs/{JOB}/rounds/1/updates",
        content=tiny_bytes(1),
        headers={"Authorization": f"Bearer {token}", "X-Client-Id": client, "X-Sample-Count": "5"},
        timeout=30,
    )
    assert r.status_code == 202, r.text


def _call(g: GatewayThread, method: str, path: str, admin: dict[str, str], **kw: Any) -> Any:
    params = {"slot": "2"} if path.endswith("/partials") else None
    if path.endswith("/clients/{client}"):
        params = {"force": "true"}  # the round's goal is all its clients
    # a close without a body stops the intake (nothing to aggregate yet: no counts)
    body = b"{}" if method in ("POST", "PUT") and not path.endswith("/close") else None
    return httpx.request(
        method, g.url + _fill(path), params=params, content=body, headers=admin, timeout=30, **kw
    )


def _logged(caplog: pytest.LogCaptureFixture, text: str, wait_s: float = 10.0) -> list[str]:
    """The records holding ``text``, waited for (bounded): the gateway's thread writes them."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_internal_routes_need_a_platform_certificate_besides_the_admin_secret(
    make_gw: Any, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.callers")
    g = make_gw()
    admin = _with_job(g)
    internal = [r for r in ROUTES if r.internal]
    for route in internal:  # the admin secret, no certificate: refused, whatever the route
        r = _call(g, route.method, route.path, admin)
        assert r.status_code == 403, (route, r.status_code, r.text)
        assert r.json()["error"] == "client_certificate_required", (route, r.text)
        assert route.path in r.json()["detail"] and "certificate" in r.json()["detail"]
    assert len(_logged(caplog, "no client certificate")) >= len(internal)
    # the SDK's and the operator's routes still take the admin secret alone
    for path in ("/v1/jobs/j1", "/v1/jobs/j1/model", "/v1/jobs", "/metrics", "/v1/router"):
        assert httpx.get(g.url + path, headers=admin).status_code == 200, path
    # nothing the refused calls asked for happened: the round is open, c1 not revoked
    view = httpx.get(g.url + "/v1/jobs/j1", headers=admin).json()
    assert view["round"] == 1 and view["revoked"] == []

    # a platform part's certificate (the CA signed it) with the admin secret reaches each route
    peer = certs.client.client_context()
    answers = {}
    for route in internal:
        if route.method == "DELETE" and route.path == "/v1/jobs/{job}":
            continue  # last
        r = _call(g, route.method, route.path, admin, verify=peer)
        answers[(route.method, route.path)] = r
        assert r.status_code < 500, (route, r.text)
        assert r.status_code == 200 or r.json()["error"] != "client_certificate_required"
    assert answers[("POST", "/v1/jobs/{job}/rounds/{number}/close")].status_code == 200
    assert answers[("DELETE", "/v1/jobs/{job}/clients/{client}")].json()["revoked"] == ["c1"]
    view = httpx.get(g.url + "/v1/jobs/j1", headers=admin).json()
    assert view["revoked"] == ["c1"]
    assert _call(g, "DELETE", "/v1/jobs/{job}", admin, verify=peer).status_code == 204
    # the certificate alone opens nothing: the admin secret is still what authorizes
    r = _call(g, "POST", "/v1/jobs/{job}/rounds/{number}/close", {}, verify=peer)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


def test_the_refusal_comes_before_the_body_is_read(make_gw: Any, certs: Certs) -> None:
    """A partial's head announcing 100 MB and no body byte sent: the 403 comes back at once."""
    g = make_gw()
    admin = _with_job(g)
    assert g.gw is not None
    plain = client_context(certs.ca.cert)  # verifies the gateway, no certificate of its own
    raw = socket.create_connection(("127.0.0.1", g.gw.port), timeout=30)
    with plain.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(
            (
                f"POST /v1/internal/jobs/{JOB}/rounds/1/partials?slot=2 HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: {admin['Authorization']}\r\n"
                f"Content-Length: {100 << 20}\r\n\r\n"
            ).encode()
        )
        with s.makefile("rb") as answer:
            status = answer.readline()
            head = b""
            while (line := answer.readline()) not in (b"\r\n", b""):
                head += line
            n = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            body = answer.read(n)
    assert status.startswith(b"HTTP/1.1 403"), status
    assert b"client_certificate_required" in body


def test_tls_internal_names_takes_only_the_parts_named(make_gw: Any, certs: Certs) -> None:
    g = make_gw(tls_internal_names="control-plane, gateway-node1")
    admin = _with_job(g)
    close = "/v1/jobs/{job}/rounds/{number}/close"
    # the CA signed "peer", but it is not one of the parts named
    r = _call(g, "POST", close, admin, verify=certs.client.client_context())
    assert r.status_code == 403 and r.json()["error"] == "client_certificate_required"
    assert "'peer'" in r.json()["detail"] and "control-plane" in r.json()["detail"]
    cp = mint_cert(certs.ca, certs.ca.cert.parent.parent / "certs", "control-plane", HOSTS)
    assert _call(g, "POST", close, admin, verify=cp.client_context()).status_code == 200


def test_the_control_plane_s_gateway_client_presents_its_certificate(
    make_gw: Any, certs: Certs, tmp_path: Path
) -> None:
    """The control plane's own TLS settings give its gateway clients its certificate (as
    ``control_plane.api.create_app`` builds them); one without a certificate is refused."""
    g = make_gw()
    admin = _with_job(g)
    cp = mint_cert(certs.ca, tmp_path / "cp", "control-plane", HOSTS)
    tls = ControlPlaneSettings(
        tls_cert_file=cp.cert, tls_key_file=cp.key, tls_ca_file=certs.ca.cert
    ).tls()
    assert tls is not None
    token = admin["Authorization"].removeprefix("Bearer ")

    async def calls() -> tuple[Any, bool, str]:
        ok = Coordinator({"n1": g.url}, admin_token=token, gateway_tls=tls.client_context())
        bare = Coordinator(
            {"n1": g.url},
            admin_token=token,
            gateway_tls=client_context(certs.ca.cert),  # verifies, presents nothing
        )
        try:
            closed = await ok.clients["n1"].close_round(JOB, 1)
            revoked = await ok.clients["n1"].revoke_client(JOB, "c2")
            with pytest.raises(GatewayCallFailed) as refused:
                await bare.clients["n1"].close_round(JOB, 2)
            return closed, revoked, str(refused.value)
        finally:
            for c in (ok, bare):
                for client in c.clients.values():
                    await client.aclose()

    closed, revoked, refusal = asyncio.run(calls())
    assert closed is not None and revoked is True
    assert "403" in refusal and "client_certificate_required" in refusal


def test_without_client_certificates_the_admin_secret_alone_still_authorizes(
    make_gw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.core")
    g = make_gw(tls_client_certs="none")
    admin = _with_job(g)
    assert _logged(caplog, "authorized by the admin secret alone")
    r = _call(g, "POST", "/v1/jobs/{job}/rounds/{number}/close", admin)
    assert r.status_code == 200, r.text

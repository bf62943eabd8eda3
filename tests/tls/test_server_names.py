"""A gateway found through discovery is verified against its node's name on every later call
(:mod:`core.server_names`), not only at discovery: real TLS servers on loopback whose
certificates name a node but not 127.0.0.1, as a chart's gateway certificate names its nodes
but no pod address.

Each server answers every GET with ``{"node": NODE}`` (``/healthz`` as a gateway does): the
control plane's gateway client, a gateway's client of its peers and the SDK's client all
reach the one whose certificate names the node they were told, and are refused by one whose
certificate names another node; a static URL (``fedfaas up``'s) keeps its host as the name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client.errors import GatewayUnavailable
from client.node import FLClient
from control_plane.coordinator import Coordinator
from core import server_names
from core.discovery import Discovery
from core.tls import TlsFiles, mint_ca, mint_cert
from gateway.core import Gateway
from gateway.settings import GatewaySettings
from tests.tls.certs import JsonHandler, https_server


def _answering(node: str) -> type[JsonHandler]:
    """A handler answering every GET ``{"node": node, "status": "ok"}``."""

    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.reply(200, {"node": node, "status": "ok"})

    return Handler


@pytest.fixture()
def pki(tmp_path: Path) -> tuple[TlsFiles, TlsFiles, TlsFiles]:
    """``(caller, n1's gateway, n2's gateway)``: the gateways' certificates name their node
    only, not the address they are reached at."""
    ca = mint_ca(tmp_path / "ca")
    caller = mint_cert(ca, tmp_path / "certs", "control-plane", ["control-plane"])
    n1 = mint_cert(ca, tmp_path / "certs", "n1", ["n1"])
    n2 = mint_cert(ca, tmp_path / "certs", "n2", ["n2"])
    return caller, n1, n2


@pytest.fixture()
def gateways(pki: tuple[TlsFiles, TlsFiles, TlsFiles]) -> Iterator[tuple[str, str]]:
    """The base URLs of n1's gateway and of n2's."""
    _, n1, n2 = pki
    with https_server(n1, _answering("n1")) as u1, https_server(n2, _answering("n2")) as u2:
        yield u1, u2


async def _discover(url: str, caller: TlsFiles) -> dict[str, str]:
    host_port = url.removeprefix("https://")
    port = int(host_port.rpartition(":")[2])

    async def resolver(host: str, p: int) -> list[str]:
        return ["127.0.0.1"]

    d = Discovery(f"gateways.example:{port}", resolver=resolver, tls=caller)
    try:
        return await d.find()
    finally:
        await d.aclose()


def test_the_control_plane_reaches_a_discovered_gateway_by_its_node_name(
    pki: tuple[TlsFiles, TlsFiles, TlsFiles], gateways: tuple[str, str]
) -> None:
    caller, _, _ = pki
    u1, u2 = gateways

    async def run() -> None:
        found = await _discover(u1, caller)
        assert found == {"n1": u1}  # its certificate names n1, not 127.0.0.1
        coord = Coordinator({}, gateway_tls=caller.client_context())
        try:
            await coord.update_nodes(found, by_name=set(found))
            assert coord.nodes["n1"].tls_name == "n1"
            assert await coord.clients["n1"].healthz() == {"node": "n1", "status": "ok"}
            # the address now answers with n2's certificate (another pod took the IP): the
            # later call is refused, as discovery would skip it
            await coord.update_nodes({"n1": u2}, by_name={"n1"})
            assert await coord.clients["n1"].healthz() is None
            # a static URL (not in by_name) is verified against its host: 127.0.0.1 is named
            # by neither certificate, so it is refused as it always was
            await coord.update_nodes({"n1": u1})
            assert coord.nodes["n1"].tls_name is None
            assert await coord.clients["n1"].healthz() is None
        finally:
            await coord.stop()

    asyncio.run(run())


def test_a_gateway_reaches_its_discovered_peer_by_its_node_name(
    tmp_path: Path, pki: tuple[TlsFiles, TlsFiles, TlsFiles], gateways: tuple[str, str]
) -> None:
    caller, _, _ = pki
    u1, u2 = gateways
    s = GatewaySettings(
        node="n0",
        state_dir=tmp_path / "gw",
        peers={"n9": u1},  # a static peer: checked against its host
        peers_service="peers.example:81",
        tls_cert_file=caller.cert,
        tls_key_file=caller.key,
        tls_ca_file=caller.ca,
    )

    async def run() -> None:
        gw = Gateway(s)
        try:
            await gw._found_peers({"n0": "https://10.9.0.1:81", "n1": u1})
            r = await gw.peers.get(f"{gw.peer_url('n1')}/healthz")
            assert r.json()["node"] == "n1"
            # the static peer at the same address is not verified by a discovered name
            gw.discovered = {}
            gw.peer_names.set({})
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await gw.peers.get(f"{gw.peer_url('n9')}/healthz")
            # found as n1 at the address whose certificate names n2: refused
            await gw._found_peers({"n1": u2})
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await gw.peers.get(f"{gw.peer_url('n1')}/healthz")
        finally:
            await gw.peers.aclose()
            await gw.discovery.aclose()  # type: ignore[union-attr]

    asyncio.run(run())


def test_the_sdk_verifies_the_gateway_against_the_name_it_was_given(
    pki: tuple[TlsFiles, TlsFiles, TlsFiles], gateways: tuple[str, str]
) -> None:
    _, n1, _ = pki
    u1, u2 = gateways
    with FLClient(u1, "job", "c1", "token", ca_file=n1.ca, tls_name="n1") as fl:
        assert fl.status()["node"] == "n1"
    refused = FLClient(u2, "job", "c1", "token", ca_file=n1.ca, tls_name="n1")
    with refused as fl, pytest.raises(GatewayUnavailable):
        fl.status()
    by_host = FLClient(u1, "job", "c1", "token", ca_file=n1.ca)  # 127.0.0.1: not named
    with by_host as fl, pytest.raises(GatewayUnavailable):
        fl.status()


def test_only_https_urls_of_the_listed_origins_get_a_name() -> None:
    assert server_names.origin("https://10.0.0.1:8081/v1") == "10.0.0.1:8081"
    assert server_names.origin("https://[fd00::1]/") == "fd00::1:443"
    assert server_names.discovered({"n1": "https://10.0.0.1:8081"}) == {"10.0.0.1:8081": "n1"}
    seen: list[dict[str, object]] = []

    async def run() -> None:
        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(dict(request.extensions))
            return httpx.Response(200)

        t = server_names.ServerNames(httpx.MockTransport(handler), {"10.0.0.1:8081": "n1"})
        async with httpx.AsyncClient(transport=t) as c:
            await c.get("https://10.0.0.1:8081/healthz")
            await c.get("https://10.0.0.2:8081/healthz")
            await c.get("http://10.0.0.1:8081/healthz")

    asyncio.run(run())
    assert [e.get("sni_hostname") for e in seen] == ["n1", None, None]


def test_the_simulators_assignment_verifies_each_gateway_by_the_name_it_was_given(
    tmp_path: Path,
) -> None:
    """``ControlPlaneAssignment`` keeps each answer's ``tls_name`` by gateway URL and the
    Simulator's clients verify by it (a discovered gateway at its pod's address)."""
    from client.simulator import ControlPlaneAssignment, Simulator

    ca = mint_ca(tmp_path / "ca")
    gateway = mint_cert(ca, tmp_path / "certs", "n1", ["n1"])
    plane = mint_cert(ca, tmp_path / "certs", "control-plane", ["127.0.0.1"])
    with https_server(gateway, _answering("n1")) as gw:

        class Assignment(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.reply(200, {"job": "job", "round": 1, "client": "c1", "node": "n1",
                                 "gateway_url": gw, "tls_name": "n1"})  # fmt: skip

        with https_server(plane, Assignment) as cp:
            assign = ControlPlaneAssignment(cp, "job", {"c1": "token"}, ca_file=ca.cert)
            assert assign("c1") == gw and assign.tls_names == {gw: "n1"}
        sim: Simulator = object.__new__(Simulator)  # only its naming of gateways runs here
        sim._assignment = assign
        assert sim._tls_name(gw) == "n1" and sim._tls_name("https://127.0.0.1:1") is None
        name = sim._tls_name(gw)
        with FLClient(gw, "job", "c1", "token", ca_file=ca.cert, tls_name=name) as fl:
            assert fl.status()["node"] == "n1"

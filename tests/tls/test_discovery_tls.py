"""Discovery over TLS (:mod:`core.discovery`): real node gateways serving TLS on one port at
three loopback addresses, as behind a headless Service (the resolver is injected: one name,
three addresses). The gateway whose certificate names its node is found; one claiming a node
its certificate does not name, and one whose certificate another CA signed, are skipped."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from bench.stack import GatewayProc, start_gateway
from core.discovery import Discovery
from core.services import free_port
from core.tls import TlsFiles, mint_ca, mint_cert
from gateway.settings import GatewaySettings
from tests.tls.certs import settings_of

pytestmark = pytest.mark.integration

#: address -> (the node the gateway there serves, the names its certificate carries, its CA)
GATEWAYS = {
    "127.0.0.2": ("n1", ["n1"], "platform"),
    "127.0.0.3": ("n2", ["n1"], "platform"),  # passes for n2 with n1's name
    "127.0.0.4": ("n3", ["n3"], "other"),  # names its node, but another CA signed it
}


def _gateway(tmp: Path, redis_url: Any, ip: str, port: int, tls: TlsFiles) -> GatewaySettings:
    node = GATEWAYS[ip][0]
    return GatewaySettings(
        node=node,
        host=ip,
        port=port,
        state_dir=tmp / node,
        redis_url=redis_url,
        redis_credentials_file=redis_url.credentials_file("gateway"),
        shm_root=Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}",
        prefer_ebpf=False,
        **settings_of(tls),
    )


@pytest.fixture()
def gateways(tmp_path: Path, redis_url: Any) -> Iterator[tuple[int, TlsFiles]]:
    """``(port, a platform part's files)``: the three gateways of :data:`GATEWAYS` running."""
    cas = {"platform": mint_ca(tmp_path / "ca"), "other": mint_ca(tmp_path / "other", "other")}
    port = free_port()
    with ExitStack() as stack:
        for ip, (node, names, ca) in GATEWAYS.items():
            files = mint_cert(cas[ca], tmp_path / "certs", node, [ip, *names])
            s = _gateway(tmp_path, redis_url, ip, port, files)
            gw: GatewayProc = start_gateway(s, tmp_path / f"{node}.log")
            stack.callback(shutil.rmtree, s.shm_root, ignore_errors=True)
            stack.callback(gw.stop)
        part = mint_cert(cas["platform"], tmp_path / "certs", "control-plane", ["127.0.0.1"])
        yield port, part


def test_discovery_keeps_only_the_gateway_whose_certificate_names_its_node(
    gateways: tuple[int, TlsFiles], caplog: pytest.LogCaptureFixture
) -> None:
    port, part = gateways

    async def three(host: str, p: int) -> list[str]:
        return sorted(GATEWAYS)

    async def find() -> dict[str, str]:
        d = Discovery(f"gateways.test:{port}", resolver=three, tls=part)
        try:
            return await d.find()
        finally:
            await d.aclose()

    caplog.set_level(logging.INFO, logger="core.discovery")
    assert asyncio.run(find()) == {"n1": f"https://127.0.0.2:{port}"}
    lines = [r.getMessage() for r in caplog.records]
    assert any("claims node 'n2' but its certificate names ['n1']" in m for m in lines), lines
    assert any("127.0.0.4" in m and "CERTIFICATE_VERIFY_FAILED" in m for m in lines), lines

"""Find the node gateways through a DNS name (a Kubernetes headless Service).

A headless Service (``clusterIP: None``, ``publishNotReadyAddresses: true``) resolves to one
A/AAAA record per gateway pod. :class:`Discovery` resolves ``HOST`` of a ``HOST:PORT``
setting with the event loop's ``getaddrinfo``, asks every address's open ``GET /healthz``
which node it serves (its ``"node"`` field) and returns ``{node: "http://IP:PORT"}`` (IPv6
addresses bracketed). An address that does not answer is skipped (logged at INFO); a name
that does not resolve gives ``{}`` (logged at WARNING). Two addresses claiming one node: the
lowest URL (as text) is kept and a WARNING names both.

The node gateways (``peers_service``) and the control plane (``gateways_service``) both call
:meth:`Discovery.watch`, which refreshes the map every ``discovery_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping

import httpx

log = logging.getLogger(__name__)

#: ``resolver(host, port)`` -> the addresses ``host`` resolves to (tests inject one)
Resolver = Callable[[str, int], Awaitable[list[str]]]


def parse_service(value: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(HOST, PORT)``; ``ValueError`` saying what is wrong otherwise."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad service address {value!r}: use HOST:PORT (a DNS name and a port)")
    return host, int(port)


def base_url(ip: str, port: int) -> str:
    """``http://IP:PORT`` with an IPv6 address in brackets."""
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"http://{host}:{port}"


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the event loop's ``getaddrinfo``), sorted, unique."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:  # socket.gaierror: no such name (yet), no resolver
        log.warning("discovery: %s does not resolve (%s); no gateway found", host, exc)
        return []
    return sorted({str(info[4][0]) for info in infos})


def pick(answers: Mapping[str, str | None]) -> dict[str, str]:
    """``{url: node or None}`` -> ``{node: url}``; of two URLs claiming a node the lowest wins."""
    out: dict[str, str] = {}
    for url, node in sorted(answers.items()):
        if node is None:
            continue
        if node in out:
            log.warning(
                "discovery: %s and %s both claim node %r; keeping %s",
                out[node],
                url,
                node,
                out[node],
            )
            continue
        out[node] = url
    return out


class Discovery:
    """The node gateways behind ``service`` (``HOST:PORT``), found on demand or periodically."""

    def __init__(self, service: str, *, timeout: float = 2.0, resolver: Resolver = resolve) -> None:
        self.host, self.port = parse_service(service)
        self.resolver = resolver
        self._client = httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def _node_at(self, url: str) -> str | None:
        try:
            r = await self._client.get(f"{url}/healthz")
            node = r.json().get("node") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.info("discovery: %s does not answer /healthz (%s); skipped", url, exc)
            return None
        if not isinstance(node, str) or not node:
            log.info("discovery: %s answered /healthz without a node name; skipped", url)
            return None
        return node

    async def find(self) -> dict[str, str]:
        """``{node: "http://IP:PORT"}`` of every address of the name that answers ``/healthz``."""
        urls = [base_url(ip, self.port) for ip in await self.resolver(self.host, self.port)]
        nodes = await asyncio.gather(*(self._node_at(u) for u in urls))
        return pick(dict(zip(urls, nodes, strict=True)))

    async def watch(
        self,
        interval: float,
        apply: Callable[[dict[str, str]], Awaitable[None]],
        stop: threading.Event | None = None,
    ) -> None:
        """``apply(await find())`` now and every ``interval`` seconds, until cancelled or ``stop``.

        A failing ``apply`` is logged and the watch goes on.
        """
        while stop is None or not stop.is_set():
            try:
                await apply(await self.find())
            except Exception:
                log.exception("discovery: applying the nodes found behind %s failed", self.host)
            await asyncio.sleep(interval)

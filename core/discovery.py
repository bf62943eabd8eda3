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

With TLS (``tls``: the caller's :class:`core.tls.TlsFiles`) every address is asked over
``https://IP:PORT``: its certificate must chain to the platform's CA (the handshake fails
otherwise) and must name the node the gateway claims in ``/healthz`` (a DNS
name of its subjectAltName equal to the node, case aside): a gateway answering for a node its
certificate does not name is skipped (logged at WARNING), so a part of the platform cannot pass
for another node. The handshake does not check the address itself (a pod's IP is rarely in a
certificate), and neither do the calls made later to the URL found: they verify the certificate
against the node's name (:mod:`core.server_names`, fed :func:`core.server_names.discovered`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from core.tls import TlsFiles

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


def base_url(ip: str, port: int, scheme: str = "http") -> str:
    """``scheme://IP:PORT`` with an IPv6 address in brackets."""
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"{scheme}://{host}:{port}"


def names_of(cert: Mapping[str, Any] | None) -> set[str]:
    """The DNS names of a peer certificate's subjectAltName (``SSLSocket.getpeercert()``'s
    dict), lowercased."""
    alt = (cert or {}).get("subjectAltName") or ()
    return {str(v).lower() for k, v in alt if k == "DNS"}


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

    def __init__(
        self,
        service: str,
        *,
        timeout: float = 2.0,
        resolver: Resolver = resolve,
        tls: TlsFiles | None = None,
    ) -> None:
        self.host, self.port = parse_service(service)
        self.resolver = resolver
        self.scheme = "https" if tls is not None else "http"
        verify: ssl.SSLContext | bool = True
        if tls is not None:
            # the chain verified and this part's certificate presented; the name is checked
            # against the node claimed (:meth:`_node_at`), not against the address
            verify = tls.client_context()
            verify.check_hostname = False
        self._client = httpx.AsyncClient(timeout=timeout, verify=verify)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def _node_at(self, url: str) -> str | None:
        cert: dict[str, Any] | None = None
        try:
            async with self._client.stream("GET", f"{url}/healthz") as r:
                if self.scheme == "https":
                    tls_object = r.extensions["network_stream"].get_extra_info("ssl_object")
                    cert = tls_object.getpeercert() if tls_object is not None else None
                await r.aread()
            node = r.json().get("node") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.info("discovery: %s does not answer /healthz (%s); skipped", url, exc)
            return None
        if not isinstance(node, str) or not node:
            log.info("discovery: %s answered /healthz without a node name; skipped", url)
            return None
        if self.scheme == "https" and node.lower() not in names_of(cert):
            log.warning(
                "discovery: %s claims node %r but its certificate names %s; skipped",
                url,
                node,
                sorted(names_of(cert)) or "no DNS name",
            )
            return None
        return node

    async def find(self) -> dict[str, str]:
        """``{node: "http(s)://IP:PORT"}`` of every address of the name that answers
        ``/healthz`` (over TLS: with a certificate naming that node)."""
        ips = await self.resolver(self.host, self.port)
        urls = [base_url(ip, self.port, self.scheme) for ip in ips]
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

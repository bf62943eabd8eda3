"""The name a server's certificate is verified against where it is not the URL's host.

A node gateway found through discovery (:mod:`core.discovery`) is reached at
``https://POD_IP:PORT``, but its certificate names the node it serves, not that address: a
certificate made before the pods exist (the chart's, an operator's) cannot name every pod
address. Every call to such a URL verifies the certificate against the node's name instead: the
TLS handshake sends the name as the server name (SNI) and checks the certificate's
subjectAltName against it, hostname checking still on (httpcore's ``sni_hostname`` request
extension). The chain is checked against the platform's CA as for any other call.

:class:`ServerNames` is the httpx transport that does it, for the URLs it lists by origin
(``host:port``); every other URL (``fedfaas up``'s static ``https://127.0.0.1:PORT``) keeps
its host as the name checked. :func:`discovered` gives the list from discovery's
``{node: url}``. The control plane's gateway clients and a gateway's client of its peers both
send through it.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import httpx


def origin(url: httpx.URL | str) -> str:
    """``host:port`` of ``url`` (lowercase; the scheme's default port where none is given)."""
    u = httpx.URL(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return f"{u.host.lower()}:{port}"


def discovered(found: Mapping[str, str]) -> dict[str, str]:
    """``{node: url}`` found by discovery -> ``{origin: node}``: each URL verified as its node."""
    return {origin(url): node for node, url in found.items()}


class ServerNames(httpx.AsyncBaseTransport):
    """An httpx transport verifying the certificate of each origin in :attr:`names` against
    the name given there (see the module); other requests go through unchanged."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, names: Mapping[str, str] | None = None
    ) -> None:
        self.inner = inner
        #: ``{origin: name}``; replaced whole (:meth:`set`), never changed in place
        self.names: dict[str, str] = dict(names or {})

    def set(self, names: Mapping[str, str]) -> None:
        """From now on, verify ``names`` (``{origin: name}``) and no other origin by name."""
        self.names = dict(names)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        name = self.names.get(origin(request.url)) if request.url.scheme == "https" else None
        if name is not None:
            request.extensions = {**request.extensions, "sni_hostname": name}
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def transport(
    verify: ssl.SSLContext | bool = True, names: Mapping[str, str] | None = None
) -> ServerNames:
    """httpx's own transport (``verify``: its trust and client certificate) behind
    :class:`ServerNames` listing ``names``."""
    return ServerNames(httpx.AsyncHTTPTransport(verify=verify), names)

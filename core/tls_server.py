"""uvicorn behind a :class:`core.tls_front.TlsFront` (issue 41): the services (runtime, cache
engine, request tracker, control plane, console) and the function replicas answer plain HTTP
sent to their TLS port a 400 ``tls_required`` JSON, as a node gateway does, where uvicorn's own
TLS listener would drop the connection at the failed handshake without a word.

:class:`TlsServer` is a ``uvicorn.Server``: with an :class:`ssl.SSLContext` it runs uvicorn's
start (the application's lifespan) without a listener of uvicorn's, and accepts on a
:class:`~core.tls_front.TlsFront` whose TLS connections get uvicorn's HTTP protocol, as
uvicorn's listener would give them (its connections, its graceful stop); without one, it is
uvicorn's own.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import uvicorn

from core.tls_front import SHORT_SSL_SHUTDOWN_TIMEOUT_S, TlsFront

#: seconds a connection may take to send its first byte, then to finish its TLS handshake
HANDSHAKE_TIMEOUT_S = 30.0


class TlsServer(uvicorn.Server):
    """``uvicorn.Server`` whose port, with ``tls``, is a :class:`TlsFront` (see the module)."""

    def __init__(self, config: uvicorn.Config, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(config)
        self.tls = tls
        self.front: TlsFront | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.tls is None:
            await super().startup(sockets)
            return
        await super().startup(sockets=[])  # the lifespan; no listener: the front is the port
        if not self.started:
            return
        config = self.config

        def protocol() -> asyncio.Protocol:  # what uvicorn's own listener makes
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            return made

        self.front = TlsFront(
            protocol, self.tls, HANDSHAKE_TIMEOUT_S, shutdown_timeout=SHORT_SSL_SHUTDOWN_TIMEOUT_S
        )
        if sockets:  # one handed over (a replica's, bound by the runtime)
            await self.front.start_on(sockets[0])
        else:
            await self.front.start(config.host, config.port)

    async def shutdown(self, sockets: Any = None) -> None:
        if self.front is not None:  # no new connections; uvicorn ends the open ones
            await self.front.stop()
            self.front = None
        await super().shutdown(sockets=sockets)

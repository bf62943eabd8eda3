"""A TLS port for an asyncio protocol server (the node gateway's, issue 41): one accept loop in
front of the server's protocol that sends plain HTTP a clear 400 instead of a failed
handshake.

asyncio's ``create_server(ssl=...)`` starts the handshake on the first byte, so a client that
speaks plain HTTP sees the connection dropped. Here each accepted connection is peeked at
(``MSG_PEEK``, nothing consumed): a TLS handshake record goes to
``loop.connect_accepted_socket(..., ssl=ctx)``; anything else gets the 400 of
:func:`core.tls.plain_http_answer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from core.tls import TLS_HANDSHAKE, plain_http_answer

log = logging.getLogger(__name__)

#: the request head a refused plain-HTTP request may send (read away before the answer)
MAX_HEAD = 16 * 1024
#: seconds the refused connection stays open for the client to read the answer
LINGER_S = 2.0


class TlsFront:
    """The TLS port: accepts each connection, peeks at its first byte, and wraps a TLS
    handshake in ``ctx`` around a new ``protocol()`` (asyncio decrypts into the buffers a
    buffered protocol hands out); plain HTTP is answered a 400 that says to use https (no
    handshake, no route), and a failed handshake (a client certificate from another CA, a
    client that does not trust ours) closes the connection, logged."""

    def __init__(
        self, protocol: Callable[[], asyncio.BaseProtocol], ctx: ssl.SSLContext, timeout: float
    ) -> None:
        self.protocol = protocol
        self.ctx = ctx
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.host = ""
        self.port = 0
        self._accept: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        sock = socket.create_server((host, port), backlog=512, reuse_port=False)
        sock.setblocking(False)
        self.sock, self.host = sock, host
        self.port = int(sock.getsockname()[1])
        self._accept = asyncio.get_running_loop().create_task(self._accept_loop())
        return self.port

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:  # out of descriptors and the like: keep the port
                log.warning("TLS port: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            t = loop.create_task(self._open(conn))
            self._pending.add(t)
            t.add_done_callback(self._pending.discard)

    async def _first_byte(self, conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(ready, self.timeout)
        finally:
            loop.remove_reader(fd)
        return conn.recv(1, socket.MSG_PEEK)

    async def _open(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await self._first_byte(conn)
        except (TimeoutError, OSError):
            conn.close()
            return
        if not first:
            conn.close()
            return
        if first[0] != TLS_HANDSHAKE:
            await self._refuse_plain(conn)
            return
        try:
            await loop.connect_accepted_socket(
                self.protocol,
                conn,
                ssl=self.ctx,
                ssl_handshake_timeout=self.timeout,
            )
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            log.info("TLS handshake refused: %s", exc)
            conn.close()

    async def _refuse_plain(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(BlockingIOError):
                conn.recv(MAX_HEAD)  # the request head: not left unread (that would reset)
            await loop.sock_sendall(conn, plain_http_answer(self.host, self.port))
            conn.shutdown(socket.SHUT_WR)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER_S):
                    while await loop.sock_recv(conn, 65536):
                        pass
        except OSError:
            pass
        finally:
            conn.close()

    async def stop(self) -> None:
        if self._accept is not None:
            self._accept.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept
        for t in list(self._pending):
            t.cancel()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

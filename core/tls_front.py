"""A TLS port for an asyncio protocol server (the node gateway's, issue 41): one accept loop in
front of the server's protocol that sends plain HTTP a clear 400 instead of a failed
handshake.

asyncio's ``create_server(ssl=...)`` starts the handshake on the first byte, so a client that
speaks plain HTTP sees the connection dropped. Here each accepted connection is peeked at
(``MSG_PEEK``, nothing consumed): a TLS handshake record goes to
``loop.connect_accepted_socket(..., ssl=ctx)``; anything else gets the 400 of
:func:`plain_http_answer`. It imports nothing of :mod:`core.tls` (pydantic): a function replica
serves through it without.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

#: the first bytes of a TLS connection (a handshake record); anything else is plain text
TLS_HANDSHAKE = 0x16

#: the request head a refused plain-HTTP request may send (read away before the answer)
MAX_HEAD = 16 * 1024
#: seconds the refused connection stays open for the client to read the answer
LINGER_S = 2.0
#: asyncio's bound (s) on a closing TLS connection: flushing what is still to send, then the
#: peer's close_notify; the connection is aborted past it, what was not sent cut off
SSL_SHUTDOWN_TIMEOUT_S = 30.0
#: the same bound where only small answers are sent and prompt stops matter (the uvicorn parts
#: and replicas, :mod:`core.tls_server`): a client that keeps an idle connection in its pool and
#: does not read it, httpx's, held a stopping server's connection, and so the server, 30 s
SHORT_SSL_SHUTDOWN_TIMEOUT_S = 2.0


class TlsFront:
    """The TLS port: accepts each connection, peeks at its first byte, and wraps a TLS
    handshake in ``ctx`` around a new ``protocol()`` (asyncio decrypts into the buffers a
    buffered protocol hands out); plain HTTP is answered a 400 that says to use https (no
    handshake, no route), and a failed handshake (a client certificate from another CA, a
    client that does not trust ours) closes the connection, logged."""

    def __init__(
        self,
        protocol: Callable[[], asyncio.BaseProtocol],
        ctx: ssl.SSLContext,
        timeout: float,
        shutdown_timeout: float = SSL_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self.protocol = protocol
        self.ctx = ctx
        self.timeout = timeout
        #: a closing connection's bound (:data:`SSL_SHUTDOWN_TIMEOUT_S`): the node gateway
        #: keeps asyncio's 30 s, since a reader of a whole model may take seconds to drain it
        self.shutdown_timeout = shutdown_timeout
        self.sock: socket.socket | None = None
        self.host = ""
        self.port = 0
        self._accept: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        return await self.start_on(socket.create_server((host, port), backlog=512))

    async def start_on(self, sock: socket.socket) -> int:
        """Accept on ``sock``, a bound socket (one handed over; listening from here);
        returns its port."""
        sock.listen(512)
        sock.setblocking(False)
        self.sock = sock
        self.host, self.port = str(sock.getsockname()[0]), int(sock.getsockname()[1])
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
                ssl_shutdown_timeout=self.shutdown_timeout,
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
        """Stop accepting and close the port (the connections opened go on, their
        server's to end)."""
        if self._accept is not None:
            self._accept.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept
        for t in list(self._pending):
            t.cancel()
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def plain_http_answer(host: str, port: int) -> bytes:
    """What a TLS port answers a plain-HTTP request: a 400 with a JSON body saying so."""
    body = (
        '{"error": "tls_required", "detail": "this port speaks HTTPS: plain HTTP was sent to '
        f'it; use https://{host}:{port}/"}}'
    ).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body

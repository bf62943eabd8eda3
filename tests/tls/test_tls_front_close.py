"""A TLS connection closed right after a large answer (the node gateway's ``Connection:
close``, a whole model) keeps sending it to a client that reads slowly: asyncio bounds the
flush of what is left to send by the shutdown timeout, so the node gateway's
:class:`core.tls_front.TlsFront` keeps asyncio's 30 s, and only the uvicorn parts
(:mod:`core.tls_server`, small answers, prompt stops) take the short one. With the short bound
here the client gets the answer cut off."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from pathlib import Path

from core.tls_front import SHORT_SSL_SHUTDOWN_TIMEOUT_S, TlsFront
from tests.tls.certs import mint

BODY = 64 * 1024 * 1024  #: more than the socket buffers hold: the rest waits for the reader
READER_WAITS_S = SHORT_SSL_SHUTDOWN_TIMEOUT_S + 2.0


class _SendAndClose(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(b"m" * BODY)
        transport.close()


class _Served:
    """A :class:`TlsFront` of ``_SendAndClose`` on its own event loop's thread."""

    def __init__(self, ctx: ssl.SSLContext, **kw: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.front = TlsFront(_SendAndClose, ctx, 10.0, **kw)
        self.port = 0
        self._done = asyncio.Event()
        started = threading.Event()

        async def main() -> None:
            self.port = await self.front.start("127.0.0.1", 0)
            started.set()
            await self._done.wait()
            await self.front.stop()

        self._thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()))
        self._thread.start()
        assert started.wait(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._done.set)
        self._thread.join(30)
        self.loop.close()


def _slow_read(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as raw:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            time.sleep(READER_WAITS_S)  # a slow reader: nothing read for a while
            got = 0
            while True:
                try:
                    chunk = tls.recv(1 << 20)
                except (ssl.SSLError, ConnectionError):
                    break  # cut off
                if not chunk:
                    break
                got += len(chunk)
            return got


def test_a_slow_reader_gets_the_whole_answer_with_the_gateways_bound(tmp_path: Path) -> None:
    certs = mint(tmp_path)
    served = _Served(certs.server.server_context())
    try:
        assert _slow_read(served.port, certs.ca.cert) == BODY
    finally:
        served.stop()


def test_the_short_bound_cuts_a_slow_reader_off(tmp_path: Path) -> None:
    """Why the gateway does not take it: the same reader, the uvicorn parts' bound."""
    certs = mint(tmp_path)
    served = _Served(certs.server.server_context(), shutdown_timeout=SHORT_SSL_SHUTDOWN_TIMEOUT_S)
    try:
        assert _slow_read(served.port, certs.ca.cert) < BODY
    finally:
        served.stop()

"""A TCP relay between a gateway and Redis that loses the answers to chosen commands.

Give the gateway :attr:`RedisRelay.url` as its Redis. Every command is relayed to Redis; one
that :attr:`RedisRelay.match` picks while answers are being lost (:meth:`RedisRelay.lose`)
reaches Redis, which runs it and answers, and then the gateway's connection is closed
instead of the answer being passed on: a write that landed, whose writer cannot know it (a
network that broke at the wrong moment). Redis's answer is read before the connection
closes, so the command has run by then, every time. Only loopback.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from tests.dataplane.loopback import LoopbackListener

#: :meth:`RedisRelay.lose`'s count for "every matching command, until :meth:`RedisRelay.passing`"
ALL = -1


class RedisRelay(LoopbackListener):
    """The relay (see the module docstring), listening on a free loopback port.

    Parameters
    ----------
    upstream_port
        Redis's port on 127.0.0.1.
    match
        Picks the commands whose answers may be lost, from the bytes of the client's write
        that carries them (a command of the journal fits one write).
    """

    def __init__(self, upstream_port: int, match: Callable[[bytes], bool]) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.match = match
        #: matching commands that ran in Redis and whose answers were lost
        self.lost = 0
        #: matching commands seen (answered or not)
        self.seen = 0
        self._to_lose = 0
        self._lock = threading.Lock()
        self._closed = False
        self._socks: set[socket.socket] = set()
        self.listen("redis-relay")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def lose(self, count: int = 1) -> None:
        """Lose the answers to the next ``count`` matching commands (:data:`ALL`: every one)."""
        with self._lock:
            self._to_lose = count

    def passing(self) -> None:
        """Relay every answer from now on."""
        self.lose(0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = list(self._socks)
        super().close()
        for s in socks:
            _close(s)

    # -- the relay ---------------------------------------------------------------------------
    def on_connection(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            _close(conn)
            return
        up.settimeout(None)
        with self._lock:
            if self._closed:  # the listener is closed too: the accept loop ends
                _close(conn)
                _close(up)
                return
            self._socks |= {conn, up}
        lost_next = threading.Event()  # the next answer on this connection is lost
        args = (conn, up, lost_next)
        threading.Thread(target=self._to_redis, args=args, daemon=True).start()
        threading.Thread(target=self._to_client, args=args, daemon=True).start()

    def _to_redis(self, conn: socket.socket, up: socket.socket, lost_next: threading.Event) -> None:
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._drop(conn, up)
                return
            if self.match(data):
                with self._lock:
                    self.seen += 1
                    if self._to_lose:
                        if self._to_lose > 0:
                            self._to_lose -= 1
                        lost_next.set()  # before it is sent: its answer comes after
            try:
                up.sendall(data)
            except OSError:
                self._drop(conn, up)
                return

    def _to_client(
        self, conn: socket.socket, up: socket.socket, lost_next: threading.Event
    ) -> None:
        while True:
            try:
                data = up.recv(1 << 16)
            except OSError:
                data = b""
            if data and lost_next.is_set():  # Redis ran it and answered: the answer is lost
                with self._lock:
                    self.lost += 1
                data = b""
            if not data:
                self._drop(conn, up)
                return
            try:
                conn.sendall(data)
            except OSError:
                self._drop(conn, up)
                return

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks -= set(socks)
        for s in socks:
            _close(s)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()

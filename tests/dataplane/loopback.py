"""A listener on a free loopback port that hands each connection to its subclass: the base of
the relays a test puts between two real components (:mod:`.peerproxy`, :mod:`.redisrelay`)."""

from __future__ import annotations

import socket
import threading
from typing import Self


class LoopbackListener:
    """Listens on 127.0.0.1 (:attr:`port`) from :meth:`listen` on; a context manager that
    closes it. Subclasses serve each accepted connection in :meth:`on_connection`."""

    port: int

    def listen(self, name: str) -> None:
        """Open the port and accept connections in a thread called ``name``; the subclass
        calls it last in its constructor, once the state its connections use is set."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=name).start()

    def on_connection(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.on_connection(conn)

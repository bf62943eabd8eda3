"""A port a test names before anything listens there, kept from every other process until then.

:func:`core.services.free_port` answers a port that is free *now*; a test that draws one for a
server it starts later (a callback receiver that is not up yet, a Redis that starts mid-test)
leaves it free meanwhile, and a process it starts in between (a runtime, a function replica)
can draw the same port: the server then fails with EADDRINUSE, or the test talks to the wrong
process. A :class:`HeldPort` is bound, not listening, until released: a connection to it is
refused exactly as to a free port, and no other process can bind it.
"""

from __future__ import annotations

import socket

from core.services.process import bound_free_port, free_ports


class HeldPort:
    """A loopback TCP port bound by this process (connections refused) until :meth:`release`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock: socket.socket | None = bound_free_port(host)
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> int:
        """Unbind (once the server that takes the port starts right after); returns the port."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        return self.port


def distinct_ports(n: int) -> list[int]:
    """``n`` different free ports (:func:`free_port` draws each at random: two draws can be
    the same port, and then one server takes both nodes' address)."""
    return free_ports(n)

"""A bounded stop for every long-running component (issue 18).

The first SIGTERM (or SIGINT) starts a clean stop: no new connections, in-flight requests
finished (or cancelled once half the grace is spent), the application's shutdown (flushes,
stores released, children stopped). A second signal, or the end of ``grace`` seconds, logs
what is abandoned (every thread's stack, the event loop's pending tasks) and exits 1 at once.
The deadline is a thread, so it fires even when the event loop is blocked.

The node gateway drives :class:`Shutdown` from its own loop; the FastAPI services (runtime,
cache engine, request tracker, control plane) run under :func:`serve`.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import os
import signal
import ssl
import tempfile
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from core.tls_server import TlsServer

if TYPE_CHECKING:
    from core.tls import TlsFiles

log = logging.getLogger("core.shutdown")


def describe_pending(loop: asyncio.AbstractEventLoop | None) -> str:
    """Every thread's stack and ``loop``'s pending tasks with theirs (what a stop abandons)."""
    out = io.StringIO()
    if loop is not None:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        except RuntimeError:  # the set changed under us (called off the loop's thread)
            tasks = []
        out.write(f"{len(tasks)} pending task(s)\n")
        for t in tasks:
            t.print_stack(limit=20, file=out)
    with tempfile.TemporaryFile("w+") as f:  # faulthandler writes to a real file
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        out.write(f.read())
    return out.getvalue()


class Shutdown:
    """A bounded stop (see the module docstring): :meth:`signal` on each signal, :meth:`done`
    once the clean stop has finished."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.loop: asyncio.AbstractEventLoop | None = None
        self.requested = threading.Event()
        self.stopped = threading.Event()
        self._timer: threading.Timer | None = None

    def signal(self, begin_stop: Callable[[], Any]) -> None:
        """A stop signal arrived: the first calls ``begin_stop`` and arms the deadline; the
        second forces the exit."""
        if self.requested.is_set():
            self.force("a second signal")
            return
        self.requested.set()
        begin_stop()
        self._timer = threading.Timer(self.grace, self.force, args=(f"{self.grace:g}s grace",))
        self._timer.daemon = True
        self._timer.start()

    def done(self) -> None:
        self.stopped.set()
        if self._timer is not None:
            self._timer.cancel()

    def force(self, why: str) -> None:
        if self.stopped.is_set():
            return
        try:
            log.error(
                "stop not finished after %s; exiting, abandoning:\n%s",
                why,
                describe_pending(self.loop),
            )
            for h in logging.getLogger().handlers:
                h.flush()
        finally:
            os._exit(1)


class _Server(TlsServer):
    """uvicorn with :class:`Shutdown`'s signal handling (a second SIGTERM forces the exit too,
    where uvicorn only forces on a second SIGINT) and its deadline; with ``tls`` its port is a
    :class:`~core.tls_front.TlsFront` (:class:`~core.tls_server.TlsServer`)."""

    def __init__(
        self, config: uvicorn.Config, shutdown: Shutdown, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(config, tls)
        self.bounded = shutdown

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # not recorded in uvicorn's captured signals: it would re-raise them after a clean
        # stop, and the process would end by SIGTERM rather than exit 0
        def begin() -> None:
            self.should_exit = True

        self.bounded.signal(begin)

    async def startup(self, sockets: Any = None) -> None:
        self.bounded.loop = asyncio.get_running_loop()
        await super().startup(sockets)


def serve(
    app: Any,
    *,
    host: str,
    port: int,
    grace: float,
    log_level: str = "warning",
    tls: TlsFiles | None = None,
) -> int:
    """Serve ``app`` until SIGTERM/SIGINT with a stop bounded by ``grace`` seconds.

    With ``tls`` the port speaks HTTPS only, in :meth:`core.tls.TlsFiles.server_context`
    (TLS 1.2+, client certificates checked against the CA); a plain-HTTP request gets a 400
    ``tls_required`` JSON saying to use https (:class:`core.tls_server.TlsServer`).

    In-flight requests get half the grace to finish, then are cancelled; the application's
    lifespan shutdown, and any handler still running in a worker thread (which no cancel
    reaches), get the rest. Returns 0 after a clean stop (the deadline exits 1).
    SIGUSR1 dumps every thread's stack to stderr.
    """
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    shutdown = Shutdown(grace)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=max(1, int(grace / 2)),
        ssl_certfile=str(tls.cert) if tls is not None else None,
        ssl_keyfile=str(tls.key) if tls is not None else None,
    )
    if tls is not None:
        config.load()  # then the context of core.tls replaces the one uvicorn built
        config.ssl = tls.server_context()
    server = _Server(config, shutdown, config.ssl if tls is not None else None)
    try:
        server.run()
        if shutdown.requested.is_set():
            # a handler cancelled in a worker thread keeps running there, and the interpreter
            # joins such threads at exit: wait for them inside the grace, whose deadline
            # (armed by the signal) ends the process if they never finish
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join()
    finally:
        shutdown.done()
    return 0

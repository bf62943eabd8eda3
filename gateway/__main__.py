"""``python -m gateway --node NAME --port P --state-dir DIR --redis URL [--minio ...]``.

The flags are ``GatewaySettings.FLAGS``, one per setting; launchers render this command with
:meth:`GatewaySettings.to_argv` instead of writing it out (:mod:`fedfaas.cmdline`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import json
import logging
import os
import signal
import sys
import tempfile
import threading

from fedfaas.objstore import UnsafeStoreRoot
from gateway.core import Gateway
from gateway.settings import GatewaySettings


def parse_settings(argv: list[str] | None = None) -> GatewaySettings:
    """The settings a ``python -m gateway`` command line gives (the inverse of ``to_argv``)."""
    return GatewaySettings.from_argv(argv)[0]


log = logging.getLogger("gateway")


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
    """A bounded stop: the first SIGTERM/SIGINT starts a clean stop; a second one, or the end
    of ``grace`` seconds, logs what is abandoned (threads, pending tasks) and exits 1 at once.

    The watchdog is a thread, so it fires even when the event loop is blocked or stuck in
    ``asyncio.Runner.close``.
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.loop: asyncio.AbstractEventLoop | None = None
        self.requested = threading.Event()
        self.stopped = threading.Event()
        self._timer: threading.Timer | None = None

    def signal(self, stop: asyncio.Event) -> None:
        if self.requested.is_set():
            self.force("a second signal")
            return
        self.requested.set()
        stop.set()
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


def main(argv: list[str] | None = None) -> int:
    settings, log_level = GatewaySettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # thread stacks on demand
    shutdown = Shutdown(settings.stop_grace)
    try:  # the gateway's BLAS use (finite checks) is small: one thread, leave the cores to I/O
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover - scikit-learn brings threadpoolctl
        pass
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        runner = asyncio.Runner()
    try:
        with runner:
            try:
                runner.run(_serve(settings, shutdown))
            except UnsafeStoreRoot as exc:  # an operator's problem: say it plainly, no traceback
                print(f"gateway: {exc}", file=sys.stderr)
                return 2
    finally:
        shutdown.done()
    return 0


async def _serve(settings: GatewaySettings, shutdown: Shutdown) -> None:
    gw = await Gateway(settings).start()
    print(
        json.dumps({"node": settings.node, "port": gw.port, "router": gw.router.mode}), flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    shutdown.loop = loop
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.signal, stop)
    # pending tasks with their stacks on demand (thread stacks: SIGUSR1)
    loop.add_signal_handler(
        signal.SIGUSR2, lambda: log.warning("tasks:\n%s", describe_pending(loop))
    )
    await stop.wait()
    await gw.stop()
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    if left:  # asyncio.Runner.close cancels these and waits for them
        out = io.StringIO()
        for t in left:
            t.print_stack(limit=8, file=out)
        log.info("%d task(s) left after the stop, cancelled now:\n%s", len(left), out.getvalue())


if __name__ == "__main__":
    raise SystemExit(main())

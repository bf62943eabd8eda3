"""``python -m gateway --node NAME --port P --state-dir DIR --redis URL [--minio ...]``.

The flags are ``GatewaySettings.FLAGS``, one per setting; launchers render this command with
:meth:`GatewaySettings.to_argv` instead of writing it out (:mod:`core.cmdline`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import json
import logging
import signal
import sys

from core.objstore import UnsafeStoreRoot
from core.shutdown import Shutdown, describe_pending
from gateway.core import Gateway
from gateway.settings import GatewaySettings


def parse_settings(argv: list[str] | None = None) -> GatewaySettings:
    """The settings a ``python -m gateway`` command line gives (the inverse of ``to_argv``)."""
    return GatewaySettings.from_argv(argv)[0]


log = logging.getLogger("gateway")


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
        loop.add_signal_handler(sig, shutdown.signal, stop.set)
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

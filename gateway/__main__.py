"""``python -m gateway --node NAME --port P --state-dir DIR --redis URL [--minio ...]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path

from gateway.core import Gateway
from gateway.settings import GatewaySettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway", description="FedFaaS node gateway")
    p.add_argument("--node")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--redis", dest="redis_url")
    p.add_argument("--shm-root", type=Path)
    p.add_argument("--minio", dest="minio_endpoint", help="host:port of MinIO for checkpoints")
    p.add_argument("--engine", dest="engine_url", help="FLStore cache engine, told of each round")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NODE=URL",
        help="another node gateway (repeat)",
    )
    p.add_argument("--fanout", type=int)
    p.add_argument("--lazy", action="store_true", default=None)
    p.add_argument("--no-ebpf", dest="prefer_ebpf", action="store_false", default=None)
    p.add_argument(
        "--spawn-aggregators", type=int, help="endpoints of a local aggregator process per job"
    )
    p.add_argument(
        "--max-inflight", type=int, help="uploads of one job received at once (0: no limit)"
    )
    p.add_argument("--pool", type=int, help="pre-faulted store buffers per job")
    p.add_argument("--admin-secret-file", type=Path)
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    over = {k: v for k, v in vars(a).items() if v is not None and k not in ("peer", "log_level")}
    if a.peer:
        over["peers"] = dict(x.split("=", 1) for x in a.peer)
    settings = GatewaySettings(**over)
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
    with runner:
        runner.run(_serve(settings))
    return 0


async def _serve(settings: GatewaySettings) -> None:
    gw = await Gateway(settings).start()
    print(
        json.dumps({"node": settings.node, "port": gw.port, "router": gw.router.mode}), flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.stop()


if __name__ == "__main__":
    raise SystemExit(main())

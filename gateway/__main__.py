"""``python -m gateway --node NAME --port P --state-dir DIR --redis URL [--minio ...]``.

The flags are :data:`gateway.settings.FLAGS`, one per setting; launchers render this command
with :meth:`GatewaySettings.to_argv` instead of writing it out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import typing
from pathlib import Path

from gateway.core import Gateway
from gateway.settings import FLAGS, GatewaySettings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway", description="FedFaaS node gateway")
    fields = GatewaySettings.model_fields
    for name, flag in FLAGS.items():
        info = fields[name]
        doc = f"setting {name} (env FEDFAAS_GATEWAY_{name.upper()})"
        if info.annotation is bool:
            p.add_argument(
                flag,
                dest=name,
                action="store_false" if flag.startswith("--no-") else "store_true",
                default=None,
                help=doc,
            )
        elif name == "peers":
            p.add_argument(flag, dest=name, type=json.loads, help='{"node": "http://..."}')
        else:
            p.add_argument(flag, dest=name, type=_scalar(info.annotation), help=doc)
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NODE=URL",
        help="another node gateway (repeat; added to --peers)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def _scalar(annotation: object) -> typing.Callable[[str], object]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0]
    if kind is Path:
        return Path
    if kind in (int, float):
        return kind  # type: ignore[return-value]
    return str


def parse_settings(argv: list[str] | None = None) -> GatewaySettings:
    """The settings a ``python -m gateway`` command line gives (the inverse of ``to_argv``)."""
    a = _parser().parse_args(argv)
    over = {k: v for k, v in vars(a).items() if v is not None and k not in ("peer", "log_level")}
    if a.peer:
        over["peers"] = {**over.get("peers", {}), **dict(x.split("=", 1) for x in a.peer)}
    return GatewaySettings(**over)


def main(argv: list[str] | None = None) -> int:
    log_level = _parser().parse_args(argv).log_level
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = parse_settings(argv)
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

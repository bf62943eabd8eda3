"""``python -m fedfaas.runtime --host H --port P --stack stack.yml --state-dir DIR [--auth-dir DIR]``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from fedfaas.runtime.app import create_app
from fedfaas.runtime.settings import RuntimeSettings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fedfaas.runtime", description="FedFaaS embedded OpenFaaS-compatible runtime"
    )
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--stack", type=Path, help="stack.yml mapping images to handler folders")
    ap.add_argument("--state-dir", type=Path, help="replica logs and state")
    ap.add_argument("--auth-dir", type=Path, help="folder with basic-auth-user/basic-auth-password")
    ap.add_argument(
        "--ready-wait", type=float, help="seconds an invocation waits for a ready replica"
    )
    ap.add_argument("--upstream-timeout", type=float, help="seconds to wait on a replica")
    ap.add_argument(
        "--ce-limits", action="store_true", default=None, help="apply OpenFaaS CE limits"
    )
    ap.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME=SOCKET",
        help="a node gateway and its router socket, to place replicas on (repeat)",
    )
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    overrides = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("log_level", "node")
    }
    if args.node:
        try:
            overrides["nodes"] = {n: Path(p) for n, p in (x.split("=", 1) for x in args.node)}
        except ValueError:
            ap.error("--node takes NAME=SOCKET")
    settings = RuntimeSettings(**overrides)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=int(settings.stop_grace) + 5,
    )


if __name__ == "__main__":
    main()

"""``python -m control_plane --port P --gateways node1=http://...,node2=... [--redis URL]``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from control_plane.errors import ControlPlaneError
from control_plane.settings import ControlPlaneSettings


def main(argv: list[str] | None = None) -> int:
    """Parse the command line (it wins over FEDFAAS_CONTROL_* env) and serve."""
    p = argparse.ArgumentParser(prog="python -m control_plane", description=__doc__)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--gateways", help="node1=http://127.0.0.1:8101,node2=...")
    p.add_argument("--redis", dest="redis_url", help="redis://127.0.0.1:6379/0 (job state)")
    p.add_argument(
        "--provider", dest="provider_url", help="OpenFaaS gateway / embedded runtime URL"
    )
    p.add_argument("--provider-auth-dir", type=Path)
    p.add_argument("--function", help="aggregator function to scale")
    p.add_argument("--admin-token-file", type=Path, help="the gateways' admin secret file")
    p.add_argument("--mc", type=float, help="max service capacity per node")
    p.add_argument("--tick", dest="tick_s", type=float, help="control period in seconds")
    p.add_argument(
        "--scale-down", dest="scale_down_s", type=float, help="idle seconds before scaling down"
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "log_level"}
    settings = ControlPlaneSettings(**overrides)
    try:
        settings.gateway_map()
    except ControlPlaneError as exc:
        sys.stderr.write(f"error: {exc.detail}\n")
        return 2

    import uvicorn

    from control_plane.api import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m control_plane --port P --gateways node1=http://...,node2=... [--redis URL]``.

``--gateways-service HOST:PORT`` finds the gateways through DNS instead of (or besides)
``--gateways`` (:mod:`core.discovery`).
"""

from __future__ import annotations

import logging
import sys

from control_plane.errors import ControlPlaneError
from control_plane.settings import ControlPlaneSettings


def main(argv: list[str] | None = None) -> int:
    """Parse the command line (it wins over FEDFAAS_CONTROL_* env) and serve."""
    settings, log_level = ControlPlaneSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from core.tls import TlsError

    try:
        settings.gateway_map()
        tls = settings.tls()
    except ControlPlaneError as exc:
        sys.stderr.write(f"error: {exc.detail}\n")
        return 2
    except TlsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2

    from control_plane.api import create_app
    from core.shutdown import serve

    return serve(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        grace=settings.stop_grace,
        tls=tls,
    )


if __name__ == "__main__":
    sys.exit(main())

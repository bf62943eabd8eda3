"""``python -m console --port P --control-plane URL --tracker URL --gateways node=URL,...``."""

from __future__ import annotations

import logging

from console.app import create_app
from console.settings import ConsoleSettings
from core.shutdown import serve


def main(argv: list[str] | None = None) -> None:
    s, log_level = ConsoleSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    serve(create_app(s), host=s.host, port=s.port, grace=5.0, tls=s.tls())


if __name__ == "__main__":
    main()

"""``python -m request_tracker --port P --redis URL --engine URL [--runtime URL]``."""

from __future__ import annotations

import logging

from core.shutdown import serve
from request_tracker.service import create_app
from request_tracker.settings import TrackerSettings


def main(argv: list[str] | None = None) -> None:
    s, log_level = TrackerSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    serve(create_app(s), host=s.host, port=s.port, grace=s.stop_grace)


if __name__ == "__main__":
    main()

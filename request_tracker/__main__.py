"""``python -m request_tracker --port P --redis URL --engine URL [--runtime URL]``."""

from __future__ import annotations

import sys

from core.cmdline import run_service
from request_tracker.service import create_app
from request_tracker.settings import TrackerSettings


def main(argv: list[str] | None = None) -> int:
    return run_service(TrackerSettings, create_app, argv)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m request_tracker --port P --redis URL --engine URL [--runtime URL]``."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from request_tracker.service import create_app
from request_tracker.settings import TrackerSettings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m request_tracker", description=__doc__)
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--redis", dest="redis_url")
    ap.add_argument("--engine", dest="engine_url")
    ap.add_argument("--runtime", dest="runtime_url")
    ap.add_argument("--query-timeout", type=float)
    ap.add_argument("--ping-interval", type=float)
    ap.add_argument("--log-level", default="INFO")
    a = vars(ap.parse_args(argv))
    logging.basicConfig(level=a.pop("log_level"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    s = TrackerSettings(**{k: v for k, v in a.items() if v is not None})
    uvicorn.run(create_app(s), host=s.host, port=s.port, log_level="warning")


if __name__ == "__main__":
    main()

"""``python -m cache_engine --port P --redis URL --minio HOST:PORT --runtime URL``."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from cache_engine.service import create_app
from cache_engine.settings import EngineSettings


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m cache_engine", description=__doc__)
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--redis", dest="redis_url")
    ap.add_argument("--minio", dest="minio_endpoint", help="host:port")
    ap.add_argument("--minio-access-key")
    ap.add_argument("--minio-secret-key")
    ap.add_argument("--bucket")
    ap.add_argument("--runtime", dest="runtime_url")
    ap.add_argument("--runtime-auth-dir")
    ap.add_argument("--policy")
    ap.add_argument("--capacity-objects", type=int)
    ap.add_argument("--function-capacity-bytes", type=int)
    ap.add_argument("--secondaries", type=int)
    ap.add_argument("--max-functions", type=int)
    ap.add_argument("--ping-interval", type=float)
    ap.add_argument("--log-level", default="INFO")
    a = vars(ap.parse_args(argv))
    logging.basicConfig(level=a.pop("log_level"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    s = EngineSettings(**{k: v for k, v in a.items() if v is not None})
    uvicorn.run(create_app(s), host=s.host, port=s.port, log_level="warning")


if __name__ == "__main__":
    main()

"""``python -m cache_engine --port P --redis URL --minio HOST:PORT --runtime URL``.

The flags are ``EngineSettings.FLAGS``; MinIO's keys come from ``FEDFAAS_ENGINE_MINIO_*``.
"""

from __future__ import annotations

import logging

from cache_engine.service import create_app
from cache_engine.settings import EngineSettings
from core.shutdown import serve


def main(argv: list[str] | None = None) -> None:
    s, log_level = EngineSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    serve(create_app(s), host=s.host, port=s.port, grace=s.stop_grace)


if __name__ == "__main__":
    main()

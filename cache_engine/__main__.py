"""``python -m cache_engine --port P --redis URL --minio HOST:PORT --runtime URL``.

The flags are ``EngineSettings.FLAGS``; MinIO's keys come from ``FEDFAAS_ENGINE_MINIO_*``.
"""

from __future__ import annotations

import sys

from cache_engine.service import create_app
from cache_engine.settings import EngineSettings
from core.cmdline import run_service


def main(argv: list[str] | None = None) -> int:
    return run_service(EngineSettings, create_app, argv)


if __name__ == "__main__":
    sys.exit(main())

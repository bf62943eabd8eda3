"""Fixtures of the FLStore tests: the serving stack on the real runtime, Redis and MinIO."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.flstore_stack import FLStoreStack
from cache_engine.cold_store import MinioColdStore
from core.services import MinioServer, RedisServer


@pytest.fixture(scope="module")
def cold(minio_server: MinioServer) -> MinioColdStore:
    return MinioColdStore(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)


def start_stack(
    tmp: Path,
    redis_server: RedisServer,
    minio_server: MinioServer,
    engine: dict[str, Any] | None = None,
    tracker: dict[str, Any] | None = None,
) -> FLStoreStack:
    """A started stack on a flushed Redis; ``engine`` and ``tracker`` are further settings."""
    r = redis_server.client()
    r.flushall()
    r.close()
    return FLStoreStack(
        tmp,
        redis_server,
        minio_server,
        engine_settings=engine or {},
        tracker_settings=tracker or {},
    ).start()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, minio_server: MinioServer
) -> Iterator[FLStoreStack]:
    """Runtime + engine + tracker (k = 1 secondary, fast pings)."""
    s = start_stack(
        tmp_path_factory.mktemp("flstore"),
        redis_server,
        minio_server,
        {"ping_interval": 0.5, "secondaries": 1},
    )
    try:
        yield s
    finally:
        s.stop()

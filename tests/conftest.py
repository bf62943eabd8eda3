"""Shared fixtures: real Redis and MinIO on free loopback ports, started once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedfaas.services import MinioServer, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real ``redis-server`` for the whole test session."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session Redis, flushed before each test that uses it."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO server (and its console) for the whole test session."""
    server = MinioServer(data_dir=tmp_path_factory.mktemp("minio")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def pytest_report_header(config: pytest.Config) -> str:
    return f"fedfaas: uid={os.getuid()} (bpf tests need root)"

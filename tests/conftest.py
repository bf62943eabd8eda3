"""Shared fixtures: real Redis and MinIO on free loopback ports, started once per session.

Under CI (``CI`` set, as ``.ci/run`` and the CI service set it) a skipped test is reported as a
failure: a run that passes has run every test it collected (eBPF, root, namespaces, helm, the
OpenFaaS binaries, the container and Kubernetes tiers). The one exception is a test marked
``ci_exempt(reason)``, for a component no machine with package registries only can build; its
reason says which and why.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis

from core.services import MinioServer, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real ``redis-server`` for the whole test session."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


class RedisURL(str):
    """The session Redis's URL that also hands out its users' credentials files.

    Its ``default`` user is off (:class:`RedisServer`): a test gives a component
    ``redis_url.credentials_file("gateway")`` and inspects keys through ``redis_url.client()``
    (the admin user).
    """

    server: RedisServer

    def credentials_file(self, user: str) -> Path:
        return self.server.credentials_file(user)

    def client(self, user: str = "admin", **kw: Any) -> redis.Redis:
        return self.server.client(user, **kw)


@pytest.fixture()
def redis_url(redis_server: RedisServer) -> Iterator[RedisURL]:
    """The session Redis, flushed before each test that uses it."""
    client = redis_server.client()
    client.flushall()
    client.close()
    url = RedisURL(redis_server.url)
    url.server = redis_server
    yield url


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO server (and its console) for the whole test session."""
    server = MinioServer(data_dir=tmp_path_factory.mktemp("minio")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def minio_root_credentials(
    minio_server: MinioServer, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A credentials file of MinIO's root, for a test whose gateway checkpoints into a bucket of
    the test's own (the platform's users reach only the ``fedfaas`` bucket)."""
    from core.secretfiles import Credentials, write_credentials

    path = tmp_path_factory.mktemp("minio-root") / "root.json"
    return write_credentials(path, Credentials(minio_server.access_key, minio_server.secret_key))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if (
        report.skipped
        and os.environ.get("CI")
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("ci_exempt") is None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {reason}"
    return report


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise KeyboardInterrupt("SIGTERM: the run stops here and takes its fixtures down")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (``timeout``, a CI job cancelled) stops pytest as Ctrl-C does: the test in
    progress is interrupted and every fixture is torn down, so the servers the tests started
    stop with it (Python's default SIGTERM ends the process at once, and the servers, each in a
    session of its own, ran on). In the controller and in each xdist worker: a worker told to
    stop by its controller is interrupted by execnet and tears down the same way.

    Under pytest-xdist (``make test`` runs two workers), each worker draws the ports of the
    servers it starts, and those of every process they start, from a slice of the free-port
    range of its own: two workers never pick the same port between the choice and the bind."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    from core.services.process import PORT_RANGE_ENV, port_range

    index, count = int(worker[2:]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    first, end = port_range()
    size = (end - first) // count
    os.environ[PORT_RANGE_ENV] = f"{first + index * size}-{first + (index + 1) * size - 1}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"fedfaas: uid={os.getuid()} (bpf tests need root)"

"""A backing server whose start fails leaves no process behind, and the error says why.

Regression: MinIO's start stopped its server on a failure (c705e46), Redis' and Prometheus'
did not: a readiness timeout left the real server running after the error went up, and a
Redis whose port someone else listened on was taken as started (that port accepted, and
another Redis there answers PING). Each test
starts the real binary, makes its start fail, and checks by PID that the process is gone
(stopped and reaped).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core import services
from core.services import PrometheusServer, RedisServer, ServiceError, free_port, process

pytestmark = pytest.mark.integration


@pytest.fixture()
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """The processes the servers spawn during the test (the real ``spawn``, recorded)."""
    procs: list[subprocess.Popen[bytes]] = []
    real = process.spawn

    def record(*args: Any, **kw: Any) -> subprocess.Popen[bytes]:
        proc = real(*args, **kw)
        procs.append(proc)
        return proc

    monkeypatch.setattr(process, "spawn", record)  # where the servers call it
    return procs


@pytest.fixture()
def taken_port() -> Iterator[int]:
    """A loopback port this test listens on (it accepts connections and answers nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen(16)
        yield int(s.getsockname()[1])


def _gone(procs: list[subprocess.Popen[bytes]]) -> None:
    (proc,) = procs
    assert proc.returncode is not None  # reaped by the start, not left a zombie or running
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)


@pytest.mark.parametrize(
    "server,said",
    [(RedisServer, "Address already in use"), (PrometheusServer, "address already in use")],
    ids=["redis", "prometheus"],
)
def test_a_server_whose_port_is_taken_fails_saying_so_and_leaves_no_process(
    tmp_path: Path,
    spawned: list[subprocess.Popen[bytes]],
    taken_port: int,
    server: type[RedisServer | PrometheusServer],
    said: str,
) -> None:
    s = server(data_dir=tmp_path / "data", port=taken_port)
    with pytest.raises(ServiceError, match="exited with code") as err:
        s.start()
    assert said in str(err.value), err.value  # the end of the server's own log says why
    _gone(spawned)
    assert s.proc is None


@pytest.fixture()
def other_redis(tmp_path: Path) -> Iterator[int]:
    """Someone else's Redis (no users, answers PING) on a loopback port."""
    binary = services.find_binary("redis-server")
    assert binary is not None
    port = free_port()
    argv = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not services.redis_ping("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, "the other Redis"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_redis_whose_port_another_redis_serves_fails_and_leaves_no_process(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]], other_redis: int
) -> None:
    """The other Redis answers PING; ours exits: the start fails saying why, not "started"."""
    s = RedisServer(data_dir=tmp_path / "data", port=other_redis)
    with pytest.raises(ServiceError, match="exited with code") as err:
        s.start()
    assert "Address already in use" in str(err.value), err.value
    _gone(spawned)
    assert services.redis_ping("127.0.0.1", other_redis)  # the other one is left alone


def test_a_prometheus_with_a_bad_configuration_fails_saying_so_and_leaves_no_process(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    server = PrometheusServer(data_dir=tmp_path / "prom", scrape_interval="not-a-duration")
    with pytest.raises(ServiceError, match="prometheus exited") as err:
        server.start()
    assert "not-a-duration" in str(err.value), err.value
    _gone(spawned)


@pytest.mark.parametrize(
    "server,probe,name",
    [(RedisServer, "ping", "redis-server"), (PrometheusServer, "ready", "prometheus")],
    ids=["redis", "prometheus"],
)
def test_a_server_not_ready_in_time_is_stopped_before_the_error_goes_up(
    tmp_path: Path,
    spawned: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    server: type[RedisServer | PrometheusServer],
    probe: str,
    name: str,
) -> None:
    """The real server runs; its readiness probe never holds (as a server stuck loading)."""
    monkeypatch.setattr(server, probe, lambda self, timeout=1.0: False)
    with pytest.raises(ServiceError, match=rf"{name} on 127\.0\.0\.1:\d+ not ready after 1"):
        server(data_dir=tmp_path / "data").start(timeout=1)
    _gone(spawned)

"""Real MinIO and Redis, started on free loopback ports by the shared fixtures."""

from __future__ import annotations

import io
import secrets
import socket
from pathlib import Path

import pytest

from core.services import MinioServer, RedisServer, free_port, free_ports, http_ok, redis_ping
from core.services.process import PORT_RANGE_ENV, PortRangeFull, ServiceError, port_range
from tests.conftest import RedisURL

pytestmark = pytest.mark.integration


def test_object_written_to_minio_reads_back_identical(minio_server: MinioServer) -> None:
    from minio import Minio

    client = Minio(
        minio_server.endpoint,
        access_key=minio_server.access_key,
        secret_key=minio_server.secret_key,
        secure=False,
    )
    bucket = "platform-" + secrets.token_hex(4)
    client.make_bucket(bucket)
    payload = secrets.token_bytes(256 * 1024)
    client.put_object(bucket, "round-1/global.safetensors", io.BytesIO(payload), len(payload))
    got = client.get_object(bucket, "round-1/global.safetensors")
    try:
        assert got.read() == payload
    finally:
        got.close()
        got.release_conn()
    assert [o.object_name for o in client.list_objects(bucket, recursive=True)] == [
        "round-1/global.safetensors"
    ]
    client.remove_object(bucket, "round-1/global.safetensors")
    client.remove_bucket(bucket)


def test_minio_console_listens_on_loopback(minio_server: MinioServer) -> None:
    assert minio_server.console_url.startswith("http://127.0.0.1:")
    assert http_ok(minio_server.console_url)


def test_redis_round_trip(redis_url: RedisURL) -> None:
    client = redis_url.client("gateway")
    try:
        client.set("fedfaas:test", b"\x00\x01binary")
        assert client.get("fedfaas:test") == b"\x00\x01binary"
        assert client.incr("fedfaas:counter") == 1
    finally:
        client.close()


def test_redis_server_stops_and_frees_its_port(tmp_path: Path) -> None:
    server = RedisServer(data_dir=tmp_path / "r", port=free_port()).start()
    port, pid = server.port, server.pid
    assert redis_ping("127.0.0.1", port)
    server.stop()
    assert not server.alive() and pid is not None
    assert not redis_ping("127.0.0.1", port)


def test_free_port_lies_below_the_kernels_ephemeral_range() -> None:
    # Outgoing connections take their source port from the ephemeral range; a server port
    # chosen there can be taken by any connection before the server binds it (a CI failure).
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random, not the same few
    with socket.socket() as s:  # a port it hands out can be bound
        s.bind(("127.0.0.1", ports.pop()))


def test_free_port_draws_from_the_range_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the test suite's parallel workers each set a range of their own (tests/conftest.py)
    monkeypatch.setenv(PORT_RANGE_ENV, "21000-21099")
    assert port_range() == (21000, 21100)
    ports = {free_port() for _ in range(50)}
    assert all(21000 <= p <= 21099 for p in ports), sorted(ports)
    monkeypatch.delenv(PORT_RANGE_ENV)
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert port_range() == (max(1024, low - 12288), low)


def _a_range_of_one_port(monkeypatch: pytest.MonkeyPatch) -> int:
    port = free_port()
    monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port}")
    return port


def test_free_ports_are_distinct_even_from_a_range_of_one_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two free_port() draws from it answer the same port: nothing holds the first meanwhile
    only = _a_range_of_one_port(monkeypatch)
    assert free_port() == free_port() == only
    first, second = free_ports(2)
    assert first == only and second != only
    with socket.socket() as a, socket.socket() as b:  # both free once drawn
        a.bind(("127.0.0.1", first))
        b.bind(("127.0.0.1", second))


def test_free_ports_leave_out_the_ports_excluded(monkeypatch: pytest.MonkeyPatch) -> None:
    only = _a_range_of_one_port(monkeypatch)
    assert free_ports(1) == [only]
    (kernels,) = free_ports(1, exclude=[only])  # the range's one port excluded: the kernel's
    assert kernels != only
    with socket.socket() as s:  # free once drawn
        s.bind(("127.0.0.1", kernels))


def test_strict_free_ports_from_a_range_too_small_say_how_many_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    only = _a_range_of_one_port(monkeypatch)
    with pytest.raises(PortRangeFull) as full:
        free_ports(2, strict=True)
    assert (full.value.needed, full.value.found, full.value.first, full.value.last) == (
        2,
        1,
        only,
        only,
    )
    assert str(full.value) == f"needed 2 free ports and {only}-{only} holds 1"
    with pytest.raises(PortRangeFull, match="needed 1 free ports and .* holds 0"):
        free_ports(1, exclude=[only], strict=True)
    assert free_ports(1, strict=True) == [only]


def test_minio_drawing_both_its_ports_from_a_range_of_one_port_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its API and console ports drawn as two free_port() calls were one port there, and
    # MinIO exited: "--console-address cannot be same as --address" (seen with 8 ports a worker)
    only = _a_range_of_one_port(monkeypatch)
    server = MinioServer(data_dir=tmp_path / "minio").start()
    try:
        assert server.port == only and server.console_port != only
        assert http_ok(f"{server.url}/minio/health/ready")
    finally:
        server.stop()


@pytest.mark.parametrize("spec", ["21000", "a-b", "900-2000", "3000-2000", "60000-70000"])
def test_a_malformed_port_range_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, spec)
    with pytest.raises(ServiceError, match="FEDFAAS_PORT_RANGE"):
        free_port()

"""Asynchronous checkpoints against the real MinIO server (core.checkpoints)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from core.checkpoints import (
    CheckpointClosed,
    CheckpointError,
    CheckpointNotFound,
    CheckpointReader,
    CheckpointWriter,
    client_key,
    global_key,
    meta_key,
)
from core.services import MinioServer, free_port


def _bucket() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def _writer(m: MinioServer, bucket: str, **kw: object) -> CheckpointWriter:
    return CheckpointWriter(m.endpoint, m.access_key, m.secret_key, bucket=bucket, **kw)  # type: ignore[arg-type]


def _reader(m: MinioServer, bucket: str) -> CheckpointReader:
    return CheckpointReader(m.endpoint, m.access_key, m.secret_key, bucket=bucket)


def test_object_keys_are_browsable_and_sort_by_round() -> None:
    assert global_key("digits", 3) == "digits/rounds/000003/global.safetensors"
    assert client_key("digits", 3, "client-007") == (
        "digits/rounds/000003/clients/client-007.safetensors"
    )
    assert meta_key("digits", 12) == "digits/rounds/000012/meta.json"
    assert sorted([global_key("j", 10), global_key("j", 9)])[0] == global_key("j", 9)


@pytest.mark.parametrize("job", ["", "../etc", "a/b", "x y", "-lead"])
def test_job_names_that_are_not_safe_object_keys_are_refused(job: str) -> None:
    with pytest.raises(ValueError):
        global_key(job, 1)


@pytest.mark.integration
def test_global_client_and_meta_arrive_bit_exact_in_the_round_layout(
    minio_server: MinioServer,
) -> None:
    bucket = _bucket()
    blob = os.urandom(3 << 20)
    with _writer(minio_server, bucket) as w:
        w.put_global("digits", 1, blob, {"version": 1, "accuracy": 0.5})
        w.put_client("digits", 1, "client-000", b"c0" * 1000)
        w.put_client("digits", 1, "client-001", b"c1" * 1000)
        w.put_meta("digits", 1, {"clients": ["client-000", "client-001"], "loss": 1.25})
        assert w.flush(30)
        assert w.stats()["written"] == 4
    r = _reader(minio_server, bucket)
    assert r.jobs() == ["digits"]
    assert r.rounds("digits") == [1]
    assert r.get_global("digits", 1) == blob
    assert r.clients("digits", 1) == ["client-000", "client-001"]
    assert r.get_client("digits", 1, "client-001") == b"c1" * 1000
    assert r.get_meta("digits", 1) == {"clients": ["client-000", "client-001"], "loss": 1.25}
    meta = r.global_meta("digits", 1)
    assert meta["version"] == "1" and meta["accuracy"] == "0.5"
    assert len(meta["sha256"]) == 64


@pytest.mark.integration
def test_latest_returns_the_newest_round_with_a_global_model(minio_server: MinioServer) -> None:
    bucket = _bucket()
    with _writer(minio_server, bucket) as w:
        assert w.latest("digits") is None
        for rnd in (1, 2, 10):
            w.put_global("digits", rnd, f"model-{rnd}".encode())
        w.put_client("digits", 11, "client-000", b"only a client update in round 11")
        # Queued objects count before they reach MinIO, so resume never goes backwards.
        assert w.latest("digits") == (10, b"model-10")
        assert w.flush(30)
        assert w.latest("digits") == (10, b"model-10")
    r = _reader(minio_server, bucket)
    assert r.rounds("digits") == [1, 2, 10, 11]
    assert r.latest("digits") == (10, b"model-10")
    with pytest.raises(CheckpointNotFound):
        r.get_global("digits", 11)
    assert r.latest("other") is None


@pytest.mark.integration
def test_minio_outage_delays_checkpoints_and_drops_none(tmp_path: Path) -> None:
    server = MinioServer(data_dir=tmp_path / "minio").start()
    port, console = server.port, server.console_port
    bucket = _bucket()
    # A small memory limit forces part of the backlog to spill to the spool folder.
    w = _writer(server, bucket, spool_dir=tmp_path / "spool", memory_limit=3 << 20, max_backoff=0.5)
    sent: dict[tuple[str, int], bytes] = {}
    try:
        for rnd in range(1, 4):
            sent["global", rnd] = os.urandom(1 << 20)
            w.put_global("job1", rnd, sent["global", rnd])
        assert w.flush(30)
        server.stop()
        for rnd in range(4, 10):
            sent["global", rnd] = os.urandom(1 << 20)
            w.put_global("job1", rnd, sent["global", rnd])
            sent["client", rnd] = os.urandom(4096)
            w.put_client("job1", rnd, "client-000", sent["client", rnd])
        deadline = time.monotonic() + 20
        while w.stats()["retries"] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        stats = w.stats()
        assert stats["retries"] >= 2 and stats["last_error"]
        assert stats["pending"] == 12
        assert stats["spilled"] > 0
        assert any((tmp_path / "spool").glob("*.bin"))
        server = MinioServer(data_dir=tmp_path / "minio", port=port, console_port=console).start()
        assert w.flush(60)
        assert w.stats()["last_error"] is None
    finally:
        w.close(5)
        r = _reader(server, bucket)
        got = {}
        if server.alive():
            for kind, rnd in sent:
                got[kind, rnd] = (
                    r.get_global("job1", rnd)
                    if kind == "global"
                    else r.get_client("job1", rnd, "client-000")
                )
        server.stop()
    assert got == sent
    assert not list((tmp_path / "spool").glob("*.bin"))


@pytest.mark.integration
def test_objects_unsent_at_close_are_spooled_and_sent_by_the_next_writer(
    minio_server: MinioServer,
    tmp_path: Path,
) -> None:
    bucket = _bucket()
    spool = tmp_path / "spool"
    dead = CheckpointWriter(
        f"127.0.0.1:{free_port()}", "x", "y", bucket=bucket, spool_dir=spool, max_backoff=0.2
    )
    dead.put_global("job2", 1, b"global-1")
    dead.put_meta("job2", 1, {"round": 1})
    assert dead.close(timeout=0.5) is False
    assert len(list(spool.glob("*.bin"))) == 2
    with pytest.raises(CheckpointClosed):
        dead.put_global("job2", 2, b"too late")
    with _writer(minio_server, bucket, spool_dir=spool) as w:
        assert w.flush(30)
    r = _reader(minio_server, bucket)
    assert r.get_global("job2", 1) == b"global-1"
    assert r.get_meta("job2", 1) == {"round": 1}
    assert not list(spool.glob("*.bin"))


def test_two_writers_cannot_share_a_spool_folder(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    first = CheckpointWriter(endpoint, "x", "y", spool_dir=tmp_path)
    try:
        with pytest.raises(CheckpointError, match="used by another writer"):
            CheckpointWriter(endpoint, "x", "y", spool_dir=tmp_path)
    finally:
        first.close(timeout=0.1)


def test_oversized_global_metadata_is_refused_before_queueing(tmp_path: Path) -> None:
    w = CheckpointWriter(f"127.0.0.1:{free_port()}", "x", "y", spool_dir=tmp_path)
    try:
        with pytest.raises(ValueError, match="put_meta"):
            w.put_global("job", 1, b"x", {"notes": "n" * 5000})
        assert w.pending() == 0
    finally:
        w.close(timeout=0.1)


def test_unreadable_minio_is_a_checkpoint_error_not_a_transport_error() -> None:
    r = CheckpointReader(f"127.0.0.1:{free_port()}", "x", "y")
    with pytest.raises(CheckpointError):
        r.rounds("digits")

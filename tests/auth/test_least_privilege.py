"""Each component's MinIO and Redis user can do its job and nothing more (real MinIO, real Redis).

- the cache engine mints, per job, temporary credentials (MinIO ``AssumeRole``) that read that
  job's checkpoints and nothing else: not another job's, and no write;
- the engine's own user reads but does not write; the gateway's writes the checkpoint bucket
  but cannot reach another bucket, create one, or manage users;
- a component's Redis user reaches its own keys only, and no ``CONFIG``/``FLUSHALL``/``ACL``;
  without a user (or with a wrong password) Redis refuses;
- a component started without its credentials file exits at once, naming the file.
"""

from __future__ import annotations

import io
import json
import secrets
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from minio import Minio
from minio.credentials.providers import StaticProvider
from minio.error import S3Error
from minio.minioadmin import MinioAdmin

from cache_engine.cold_store import ColdStoreError, MinioColdStore
from cache_engine.keys import ObjectKey
from core.auth import write_token_file
from core.secretfiles import Credentials, read_credentials, write_credentials
from core.services import MinioServer, RedisServer
from tests.commands import run_module

pytestmark = pytest.mark.integration


def _as(minio_server: MinioServer, user: str, **kw: object) -> Minio:
    c = read_credentials(minio_server.credentials_file(user), "MinIO")
    return Minio(minio_server.endpoint, access_key=c.username, secret_key=c.password, secure=False)


def _engine_store(minio_server: MinioServer) -> MinioColdStore:
    c = read_credentials(minio_server.credentials_file("cache-engine"), "MinIO")
    return MinioColdStore(minio_server.endpoint, c.username, c.password, create=False)


@pytest.fixture(scope="module")
def two_jobs(minio_server: MinioServer) -> tuple[str, str]:
    """Round 1 of two jobs in the checkpoint bucket (written as root, the launcher)."""
    root = MinioColdStore(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    a, b = f"job-a-{secrets.token_hex(3)}", f"job-b-{secrets.token_hex(3)}"
    w = {"w": np.ones((2, 2), np.float32)}
    for job in (a, b):
        root.write_round(job, 1, {"c1": w}, w)
    return a, b


def test_an_engine_grant_reads_its_job_only_and_writes_nothing(
    minio_server: MinioServer, two_jobs: tuple[str, str]
) -> None:
    a, b = two_jobs
    engine = _engine_store(minio_server)
    grants = engine.job_credentials({a})
    assert set(grants) == {a}
    g = grants[a]
    assert g["expires"] - time.time() > 800  # MinIO's minimum lifetime, 900 s
    assert engine.job_credentials({a})[a] == g  # reused while far from expiry
    fn = MinioColdStore(
        minio_server.endpoint,
        g["access_key"],
        g["secret_key"],
        session_token=g["session_token"],
        create=False,
    )
    assert np.array_equal(fn.get(ObjectKey(a, 1, "update", "c1")), np.ones(4, np.float32))
    with pytest.raises(ColdStoreError, match="AccessDenied"):
        fn.get_bytes(ObjectKey(b, 1, "meta"))
    with pytest.raises(S3Error) as exc:
        fn.put_bytes(ObjectKey(a, 2, "meta"), b"{}")
    assert exc.value.code == "AccessDenied"
    with pytest.raises(S3Error) as exc:
        fn.client.remove_object(fn.bucket, f"{a}/rounds/000001/meta.json")
    assert exc.value.code == "AccessDenied"
    with pytest.raises(S3Error) as exc:  # not even a listing of its own job
        list(fn.client.list_objects(fn.bucket, prefix=f"{a}/"))
    assert exc.value.code == "AccessDenied"
    # the root credentials could have done all of it: the grant is what restricts
    assert MinioColdStore(
        minio_server.endpoint, minio_server.access_key, minio_server.secret_key
    ).get_bytes(ObjectKey(b, 1, "meta"))


def test_the_engine_user_reads_every_job_but_writes_nothing(
    minio_server: MinioServer, two_jobs: tuple[str, str]
) -> None:
    engine = _engine_store(minio_server)
    assert set(two_jobs) <= set(engine.jobs())
    assert engine.rounds(two_jobs[1]) == [1]
    with pytest.raises(S3Error) as exc:
        engine.put_bytes(ObjectKey(two_jobs[0], 2, "meta"), b"{}")
    assert exc.value.code == "AccessDenied"


def test_the_gateway_user_stays_in_the_checkpoint_bucket(minio_server: MinioServer) -> None:
    root = minio_server.client()
    other = f"other-{secrets.token_hex(3)}"
    root.make_bucket(other)
    root.put_object(other, "x", io.BytesIO(b"x"), 1)
    gw = _as(minio_server, "gateway")
    key = f"gw-{secrets.token_hex(3)}/rounds/000001/meta.json"
    gw.put_object(minio_server.bucket, key, io.BytesIO(b"{}"), 2)  # its job: write, read, delete
    assert gw.get_object(minio_server.bucket, key).read() == b"{}"
    gw.remove_object(minio_server.bucket, key)
    for refused in (
        lambda: gw.get_object(other, "x").read(),
        lambda: list(gw.list_objects(other)),
        lambda: gw.put_object(other, "y", io.BytesIO(b"y"), 1),
        lambda: gw.make_bucket(f"new-{secrets.token_hex(3)}"),
    ):
        with pytest.raises(S3Error) as exc:
            refused()
        assert exc.value.code == "AccessDenied"
    c = read_credentials(minio_server.credentials_file("gateway"), "MinIO")
    admin = MinioAdmin(
        endpoint=minio_server.endpoint,
        credentials=StaticProvider(c.username, c.password),
        secure=False,
    )
    with pytest.raises(Exception, match="AccessDenied|Access Denied|not allowed"):
        admin.user_add("intruder", secrets.token_urlsafe(16))


@pytest.mark.parametrize(
    "command",
    [("CONFIG", "GET", "requirepass"), ("FLUSHALL",), ("ACL", "LIST"), ("KEYS", "*")],
    ids=lambda c: c[0],
)
def test_a_component_redis_user_runs_no_admin_or_dangerous_command(
    redis_server: RedisServer, command: tuple[str, ...]
) -> None:
    with redis_server.client("gateway") as r, pytest.raises(redis.exceptions.NoPermissionError):
        r.execute_command(*command)


def test_a_component_redis_user_reaches_its_own_keys_only(redis_server: RedisServer) -> None:
    with redis_server.client("cache-engine") as engine, redis_server.client("gateway") as gw:
        engine.set("flstore:test:own", "1")
        gw.set("fedfaas:test:own", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            gw.get("flstore:test:own")
        with pytest.raises(redis.exceptions.NoPermissionError):
            engine.set("fedfaas:jobs", "x")


def test_redis_refuses_a_client_without_a_user_or_with_a_wrong_password(
    redis_server: RedisServer,
) -> None:
    with (
        redis.Redis.from_url(redis_server.url) as r,
        pytest.raises(redis.exceptions.AuthenticationError),
    ):
        r.ping()
    with (
        redis.Redis.from_url(redis_server.url, username="gateway", password="wrong") as r,
        pytest.raises(redis.exceptions.AuthenticationError),
    ):
        r.ping()
    cfg = redis_server.config_path
    assert cfg.stat().st_mode & 0o777 == 0o600
    password = read_credentials(redis_server.credentials_file("gateway"), "Redis").password
    assert password not in cfg.read_text()  # only its SHA-256


@pytest.mark.parametrize("which", ["minio", "redis"])
def test_the_engine_without_its_credentials_file_exits_naming_it(
    tmp_path: Path, which: str
) -> None:
    admin = write_token_file(tmp_path / "admin", "a" * 32)
    present = write_credentials(tmp_path / "present.json", Credentials("u", "p"))
    missing = tmp_path / f"{which}-missing.json"
    files = {"minio": present, "redis": present, which: missing}
    out = run_module(
        "cache_engine",
        "--port",
        "1",
        "--admin-token-file",
        str(admin),
        "--minio-credentials-file",
        str(files["minio"]),
        "--redis-credentials-file",
        str(files["redis"]),
    )
    assert out.returncode != 0
    assert str(missing) in out.stderr


def test_the_gateway_with_a_malformed_credentials_file_exits_naming_it(tmp_path: Path) -> None:
    bad = write_token_file(tmp_path / "redis.json", json.dumps({"username": "gateway"}))
    out = run_module(
        "gateway",
        "--port",
        "1",
        "--state-dir",
        str(tmp_path / "state"),
        "--no-ebpf",
        "--shm-root",
        f"/dev/shm/fedfaas-test-{secrets.token_hex(4)}",
        "--redis-credentials-file",
        str(bad),
    )
    assert out.returncode != 0
    assert str(bad) in out.stderr and "password" in out.stderr

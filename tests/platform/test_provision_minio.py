"""``python -m fedfaas.provision_minio``: the Helm chart's hook Job makes the components' MinIO
users from secret files, with the policies of ``fedfaas up`` (real MinIO, real processes)."""

from __future__ import annotations

import io
import json
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3.util.retry
from minio import Minio
from minio.credentials.providers import StaticProvider
from minio.error import S3Error
from minio.minioadmin import MinioAdmin

from core.auth import write_token_file
from core.secretfiles import Credentials, read_credentials, write_credentials
from core.services import (
    MINIO_ROOT_PASSWORD,
    MINIO_ROOT_USER,
    MinioServer,
    free_port,
    minio_policies,
    minio_user_file,
    provision_minio,
)
from fedfaas.provision_minio import main, parser
from tests.commands import run_module
from tests.dataplane.loopback import LoopbackListener


def _users_dir(folder: Path, tag: str) -> Path:
    """A users folder as the chart mounts it: ``minio-<user>.json`` for every user."""
    folder.mkdir(parents=True, exist_ok=True)
    for user in minio_policies(""):
        creds = Credentials(f"{tag}-{user}", secrets.token_urlsafe(24))
        write_credentials(minio_user_file(folder, user), creds)
    return folder


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("fedfaas.provision_minio", *args, timeout=120)


# ------------------------------------------------------------------ the command line
def test_command_line_requires_the_endpoint_and_both_folders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--endpoint", "m:9000", "--users-dir", "/u"])
    assert exc.value.code == 2
    assert "--root-credentials-dir" in capsys.readouterr().err
    args = parser().parse_args(
        ["--endpoint", "m:9000", "--root-credentials-dir", "/r", "--users-dir", "/u"]
    )
    assert (args.bucket, args.secure, args.wait) == ("fedfaas", False, 300.0)
    assert (args.root_credentials_dir, args.users_dir) == (Path("/r"), Path("/u"))


def test_a_missing_root_file_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users = _users_dir(tmp_path / "users", "x")
    code = main(
        ["--endpoint", "127.0.0.1:1", "--root-credentials-dir", str(tmp_path / "root")]
        + ["--users-dir", str(users), "--wait", "0"]
    )
    assert code == 1
    assert str(tmp_path / "root" / MINIO_ROOT_USER) in capsys.readouterr().err


def test_a_missing_user_file_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    write_token_file(root / MINIO_ROOT_USER, "root")
    write_token_file(root / MINIO_ROOT_PASSWORD, "password")
    users = _users_dir(tmp_path / "users", "x")
    minio_user_file(users, "cache-engine").unlink()
    port = free_port()
    code = main(
        ["--endpoint", f"127.0.0.1:{port}", "--root-credentials-dir", str(root)]
        + ["--users-dir", str(users), "--wait", "0"]
    )
    assert code == 1
    assert "minio-cache-engine.json" in capsys.readouterr().err


def test_provisioning_needs_a_credentials_file_for_every_user(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no MinIO user 'analyst'"):
        minio_user_file(tmp_path, "analyst")
    users = _users_dir(tmp_path / "users", "x")
    only_gateway = {"gateway": minio_user_file(users, "gateway")}
    # refused before any connection: nothing listens on port 1
    with pytest.raises(KeyError, match="cache-engine"):
        provision_minio("127.0.0.1:1", Credentials("root", "pw"), only_gateway, "fedfaas")


def test_minio_that_never_gets_ready_fails_after_the_wait(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_token_file(root / MINIO_ROOT_USER, "root")
    write_token_file(root / MINIO_ROOT_PASSWORD, "password")
    users = _users_dir(tmp_path / "users", "x")
    endpoint = f"127.0.0.1:{free_port()}"
    res = _run(
        "--endpoint",
        endpoint,
        "--root-credentials-dir",
        str(root),
        "--users-dir",
        str(users),
        "--wait",
        "1",
    )
    assert res.returncode == 1
    assert f"MinIO at {endpoint} not ready after 1s" in res.stderr


# ------------------------------------------------------------------ against a real MinIO
@pytest.fixture(scope="module")
def own_minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A MinIO of this module's own: the users made here do not touch the session's."""
    base = tmp_path_factory.mktemp("provision-minio")
    server = MinioServer(data_dir=base / "data", secrets_dir=base / "secrets").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.integration
def test_the_entry_point_makes_each_user_with_its_policy_only(
    own_minio: MinioServer, tmp_path: Path
) -> None:
    bucket = f"k8s-{secrets.token_hex(3)}"
    users = _users_dir(tmp_path / "users", f"k8s{secrets.token_hex(2)}")
    assert own_minio.secrets_dir is not None
    args = ["--endpoint", own_minio.endpoint, "--root-credentials-dir", str(own_minio.secrets_dir)]
    args += ["--users-dir", str(users), "--bucket", bucket, "--wait", "30"]
    for _ in range(2):  # idempotent: an upgrade runs the hook again
        res = _run(*args)
        assert res.returncode == 0, res.stderr
    assert f"bucket {bucket}" in res.stdout

    admin = MinioAdmin(
        endpoint=own_minio.endpoint,
        credentials=StaticProvider(own_minio.access_key, own_minio.secret_key),
        secure=False,
    )

    def client(user: str) -> Minio:
        c = read_credentials(minio_user_file(users, user), "MinIO")
        info = json.loads(admin.user_info(c.username))
        assert info["policyName"] == f"fedfaas-{user}" and info["status"] == "enabled"
        return Minio(own_minio.endpoint, c.username, c.password, secure=False)

    gateway, engine = client("gateway"), client("cache-engine")
    # the gateway writes and reads its bucket, and reaches no other
    gateway.put_object(bucket, "job/1/global", io.BytesIO(b"w" * 8), 8)
    assert gateway.get_object(bucket, "job/1/global").read() == b"w" * 8
    with pytest.raises(S3Error, match="AccessDenied"):
        gateway.put_object(own_minio.bucket, "x", io.BytesIO(b"x"), 1)
    with pytest.raises(S3Error, match="AccessDenied"):
        gateway.make_bucket(f"other-{secrets.token_hex(3)}")
    # the cache engine reads the bucket and writes nothing
    assert engine.get_object(bucket, "job/1/global").read() == b"w" * 8
    with pytest.raises(S3Error, match="AccessDenied"):
        engine.put_object(bucket, "job/1/other", io.BytesIO(b"x"), 1)


@pytest.mark.integration
def test_a_policy_minio_lost_before_it_was_attached_is_added_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MinIO loads its IAM state in the background after it answers: a policy added meanwhile
    was gone at its attachment once (404 XMinioAdminNoSuchPolicy under CI). Here the first
    policy added is really removed before it is attached: provisioning adds it again."""
    bucket = f"lost-{secrets.token_hex(3)}"
    users = _users_dir(tmp_path / "users", f"lost{secrets.token_hex(2)}")
    real_add, removed = MinioAdmin.policy_add, []

    def add_then_lose(self: MinioAdmin, name: str, *args: object, **kw: object) -> str:
        out = real_add(self, name, *args, **kw)  # type: ignore[arg-type]
        if not removed:
            removed.append(name)
            self.policy_remove(name)
        return out

    # a bare MinIO of its own (not provisioned by its start): no user holds the policies yet,
    # so MinIO lets one be removed
    with monkeypatch.context() as m:
        m.setattr(MinioServer, "provision", lambda self: None)
        server = MinioServer(data_dir=tmp_path / "data", secrets_dir=tmp_path / "secrets")
        server.start()
    try:
        monkeypatch.setattr(MinioAdmin, "policy_add", add_then_lose)
        provision_minio(
            server.endpoint,
            Credentials(server.access_key, server.secret_key),
            {u: minio_user_file(users, u) for u in minio_policies(bucket)},
            bucket,
        )
        assert removed
        admin = MinioAdmin(
            endpoint=server.endpoint,
            credentials=StaticProvider(server.access_key, server.secret_key),
            secure=False,
        )
        for user in minio_policies(bucket):
            c = read_credentials(minio_user_file(users, user), "MinIO")
            assert json.loads(admin.user_info(c.username))["policyName"] == f"fedfaas-{user}"
    finally:
        server.stop()


class _InitialisingMinio(LoopbackListener):
    """A TCP front of a real MinIO that answers its first ``refusals`` requests as MinIO does
    while it initialises after its readiness answers 200 (503, ``Retry-After: 60``, then the
    connection closed), and relays every later connection to MinIO unchanged (SigV4 signs
    the Host header the client sent, which the relay keeps)."""

    def __init__(self, target: str, refusals: int) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.left = refusals
        self.refused = 0
        self.listen("initialising-minio")
        self.endpoint = f"127.0.0.1:{self.port}"

    def on_connection(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if self.left > 0:
                self.left -= 1
                with conn.makefile("rb") as request:  # its head, to the blank line
                    while request.readline() not in (b"\r\n", b""):
                        pass
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 60\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                self.refused += 1
                return
            with socket.create_connection(self.target) as up:
                back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
                back.start()
                _pipe(conn, up)
                back.join(timeout=30)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.mark.integration
def test_provisioning_asks_an_initialising_minio_again_within_seconds(
    own_minio: MinioServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after its readiness answers 200, MinIO may answer 503 with ``Retry-After: 60``;
    minio's default client slept that minute (this module's test of a lost policy took 62 s in
    the default tier, 2 s alone). Provisioning asks again after a short backoff instead."""
    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        real_sleep(min(seconds, 2.0))  # the old client's minute is seen, never waited

    monkeypatch.setattr(urllib3.util.retry.time, "sleep", sleep)
    front = _InitialisingMinio(own_minio.endpoint, refusals=3)
    bucket = f"init-{secrets.token_hex(3)}"
    users = _users_dir(tmp_path / "users", f"init{secrets.token_hex(2)}")
    try:
        provision_minio(
            front.endpoint,
            Credentials(own_minio.access_key, own_minio.secret_key),
            {u: minio_user_file(users, u) for u in minio_policies(bucket)},
            bucket,
        )
    finally:
        front.close()
    assert front.refused == 3
    assert waits and max(waits) <= 2.0, waits
    assert own_minio.client().bucket_exists(bucket)


@pytest.mark.integration
def test_a_start_whose_provisioning_fails_leaves_no_server_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MinIO whose provisioning raised once stayed alive after its test (seen after a CI
    failure): the start stops it before the error goes up."""

    pids: list[int] = []

    def refuse(self: MinioServer) -> None:
        assert self.proc is not None
        pids.append(self.proc.pid)
        raise RuntimeError("provisioning refused")

    monkeypatch.setattr(MinioServer, "provision", refuse)
    server = MinioServer(data_dir=tmp_path / "data", secrets_dir=tmp_path / "secrets")
    with pytest.raises(RuntimeError, match="provisioning refused"):
        server.start()
    (pid,) = pids
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(pid, 0)

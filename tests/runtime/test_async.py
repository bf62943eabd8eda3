"""Asynchronous invocations (``/async-function/*``) on the embedded runtime: the real faas-cli,
a real Redis, real runtime processes and a callback server the test runs."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.services import RedisServer, ServiceError
from runtime import RuntimeProcess
from runtime.async_calls import STREAM
from tests.conftest import RedisURL
from tests.platform.conftest import part_context
from tests.polling import wait_until
from tests.ports import HeldPort
from tests.runtime.conftest import (
    FUNCTION_TOKEN,
    STACK,
    available,
    client,
    echo_body,
    with_function_token,
)
from tests.runtime.test_secrets import _faas_cli

pytestmark = pytest.mark.integration


class Callbacks:
    """An HTTP server on a loopback port that records every POST; it answers the statuses of
    ``answers`` in turn, then 200."""

    def __init__(self, port: int = 0, answers: list[int] | None = None) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.answers = list(answers or [])
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = owner.answers.pop(0) if owner.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/cb"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def callbacks() -> Iterator[Callbacks]:
    cb = Callbacks()
    try:
        yield cb
    finally:
        cb.close()


def _runtime(state_dir: Path, redis_url: RedisURL | None, **settings: Any) -> RuntimeProcess:
    extra: dict[str, Any] = {"ready_wait": 5, "async_retry_backoff": 0.2, "async_claim_idle": 1}
    if redis_url is not None:
        extra["redis_url"] = str(redis_url)
        extra["redis_credentials_file"] = redis_url.credentials_file("runtime")
    return RuntimeProcess(stack=STACK, state_dir=state_dir, settings={**extra, **settings})


@pytest.fixture()
def async_rt(tmp_path: Path, redis_url: RedisURL) -> Iterator[RuntimeProcess]:
    """A runtime on the test's Redis with echo deployed and ready (3 attempts per call)."""
    rt = _runtime(tmp_path / "rt", redis_url, async_max_attempts=3, async_max_body=1024).start()
    try:
        with_function_token(rt)
        _deploy_echo(rt)
        yield rt
    finally:
        rt.stop()


def _deploy_echo(rt: RuntimeProcess) -> None:
    with client(rt, timeout=30) as http:
        assert http.post("/system/functions", json=echo_body("echo")).status_code == 202
        wait_until(lambda: available(http, "echo") == 1, timeout=60)


def _queued(redis_url: RedisURL) -> tuple[int, int]:
    """(entries in the stream, entries pending in its group)."""
    with redis_url.client() as r:
        length = int(r.xlen(STREAM))
        pending = int(r.xpending(STREAM, "workers")["pending"]) if length else 0
        return length, pending


def test_faas_cli_invoke_async_delivers_the_response_to_the_callback(
    async_rt: RuntimeProcess, callbacks: Callbacks, redis_url: RedisURL, tmp_path: Path
) -> None:
    cli = _faas_cli()  # skips where it is missing, fails under CI
    payload = bytes(range(256)) * 3 + b"\xff\xfe end"
    out = subprocess.run(
        [str(cli), "invoke", "echo", "--async", "--gateway", async_rt.url]
        + ["-H", f"X-Callback-Url: {callbacks.url}"]
        + ["-H", f"Authorization: Bearer {FUNCTION_TOKEN}", "-H", "X-Call-Id: cli-call-1"]
        + ["--content-type", "application/octet-stream"],
        input=payload,
        capture_output=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=60,
    )
    assert out.returncode == 0, out
    assert b"submitted asynchronously" in out.stdout + out.stderr, out
    wait_until(lambda: len(callbacks.received) == 1, timeout=30)
    headers, body = callbacks.received[0]
    assert body == payload
    assert headers["x-call-id"] == "cli-call-1"
    assert headers["x-function-status"] == "200"
    assert headers["x-function-name"] == "echo"
    assert headers["content-type"] == "application/octet-stream"
    assert float(headers["x-duration-seconds"]) >= 0
    wait_until(lambda: _queued(redis_url) == (0, 0))


def test_the_call_id_of_the_202_is_the_callbacks_and_the_path_and_query_reach_the_function(
    async_rt: RuntimeProcess, callbacks: Callbacks
) -> None:
    with client(async_rt) as http:
        r = http.post(
            "/async-function/echo/some/path?x=1",
            headers={"X-Callback-Url": callbacks.url},
            content=b"",
        )
        assert r.status_code == 202, r.text
        call_id = r.headers["x-call-id"]
        assert call_id
        # a GET without a body makes echo report the path and query it saw
        r = http.get("/async-function/echo/p?q=2", headers={"X-Callback-Url": callbacks.url})
        assert r.status_code == 202
    wait_until(lambda: len(callbacks.received) == 2, timeout=30)
    by_id = {h["x-call-id"]: (h, b) for h, b in callbacks.received}
    assert by_id[call_id][0]["x-function-status"] == "200"
    seen = httpx.Response(200, content=by_id[r.headers["x-call-id"]][1]).json()
    assert seen["path"] == "/p" and seen["query"] == {"q": "2"}


def test_a_wrong_token_is_refused_at_once_and_a_token_changed_later_reaches_the_callback(
    async_rt: RuntimeProcess, callbacks: Callbacks
) -> None:
    with client(async_rt) as http:
        r = http.post(
            "/async-function/echo",
            headers={"Authorization": "Bearer wrong", "X-Callback-Url": callbacks.url},
            content=b"x",
        )
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        r = http.post("/async-function/echo", headers={"Authorization": ""}, content=b"x")
        assert r.status_code == 401 and "Bearer" in r.json()["detail"]
        # checked from the headers, before the body: an oversized body without the token is 401
        r = http.post(
            "/async-function/echo", headers={"Authorization": "Bearer no"}, content=b"y" * 4096
        )
        assert r.status_code == 401, r.text
    assert callbacks.received == []


def test_the_function_checks_its_token_again_on_delivery_and_its_401_is_the_result(
    async_rt: RuntimeProcess, callbacks: Callbacks, redis_url: RedisURL
) -> None:
    with client(async_rt) as http:
        assert http.post("/system/functions", json=echo_body("late")).status_code == 202
        # accepted with the token of now; the replica is still starting when the token changes
        r = http.post("/async-function/late", headers={"X-Callback-Url": callbacks.url})
        assert r.status_code == 202, r.text
        secret = {"name": "fedfaas-function-token", "value": "a-new-token-0123456789"}
        assert http.put("/system/secrets", json=secret).status_code == 202
    wait_until(lambda: len(callbacks.received) == 1, timeout=30)
    headers, body = callbacks.received[0]
    assert headers["x-function-status"] == "401" and headers["x-function-name"] == "late"
    assert headers["x-call-id"] == r.headers["x-call-id"]
    assert b"wrong function token" in body
    wait_until(lambda: _queued(redis_url) == (0, 0))


def test_bad_async_requests_get_json_errors(async_rt: RuntimeProcess, callbacks: Callbacks) -> None:
    with client(async_rt) as http:
        r = http.post("/async-function/ghost", content=b"x")
        assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
        r = http.post("/async-function/echo", content=b"y" * 2048)
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large", r.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
            for _ in range(4):
                yield b"z" * 512

        r = http.post("/async-function/echo", content=chunks())
        assert r.status_code == 413 and "1024" in r.json()["detail"], r.text
        for bad in ("ftp://127.0.0.1/cb", "not a url", "http:///nohost"):
            r = http.post("/async-function/echo", headers={"X-Callback-Url": bad}, content=b"x")
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"] == "invalid_request" and "X-Callback-Url" in r.json()["detail"]
    assert callbacks.received == []


def test_without_redis_async_routes_answer_501(runtime: RuntimeProcess) -> None:
    """After the checks every call gets (the function exists, the caller has its token)."""
    with client(runtime) as http:
        assert http.post("/system/functions", json=echo_body("no-queue")).status_code == 202
        try:
            assert http.post("/async-function/nope", content=b"x").status_code == 404
            bare = httpx.post(f"{runtime.url}/async-function/no-queue", content=b"x")
            assert bare.status_code == 401 and bare.json()["error"] == "unauthorized"
            r = http.post("/async-function/no-queue", content=b"x")
        finally:
            http.request("DELETE", "/system/functions", json={"functionName": "no-queue"})
    assert r.status_code == 501
    assert r.json()["error"] == "not_implemented" and "--redis-url" in r.json()["detail"]


def test_a_callback_that_fails_twice_then_succeeds_gets_the_call_once_invoked(
    async_rt: RuntimeProcess, redis_url: RedisURL
) -> None:
    cb = Callbacks(answers=[503, 500])
    try:
        with client(async_rt) as http:
            r = http.post("/async-function/echo", headers={"X-Callback-Url": cb.url}, content=b"hi")
            assert r.status_code == 202
        wait_until(lambda: len(cb.received) == 3, timeout=30)
        assert [b for _, b in cb.received] == [b"hi"] * 3
        assert {h["x-call-id"] for h, _ in cb.received} == {r.headers["x-call-id"]}
        wait_until(lambda: _queued(redis_url) == (0, 0))
        with client(async_rt) as http:  # invoked once: the retries were of the callback only
            assert http.get("/system/function/echo").json()["invocationCount"] == 1
    finally:
        cb.close()


def test_a_callback_that_always_fails_is_dropped_after_the_bound(
    async_rt: RuntimeProcess, redis_url: RedisURL
) -> None:
    cb = Callbacks(answers=[503] * 100)
    try:
        with client(async_rt) as http:
            r = http.post("/async-function/echo", headers={"X-Callback-Url": cb.url}, content=b"x")
            assert r.status_code == 202
        wait_until(lambda: _queued(redis_url) == (0, 0), timeout=30)
        assert len(cb.received) == 3  # async_max_attempts
        log = async_rt.log_path.read_text()
        assert f"async call {r.headers['x-call-id']} to echo dropped after 3 attempts" in log
        # acknowledged: not taken over again once the claim time (1s) has passed
        with pytest.raises(AssertionError):
            wait_until(lambda: len(cb.received) > 3, timeout=3)
    finally:
        cb.close()


def test_a_call_without_callback_is_acknowledged_once_invoked_and_a_4xx_callback_not_retried(
    async_rt: RuntimeProcess, redis_url: RedisURL
) -> None:
    cb = Callbacks(answers=[404])
    try:
        with client(async_rt) as http:
            assert http.post("/async-function/echo", content=b"a").status_code == 202
            wait_until(lambda: _queued(redis_url) == (0, 0), timeout=30)
            wait_until(lambda: http.get("/system/function/echo").json()["invocationCount"] == 1)
            r = http.post("/async-function/echo", headers={"X-Callback-Url": cb.url}, content=b"b")
            assert r.status_code == 202
        wait_until(lambda: len(cb.received) == 1, timeout=30)
        wait_until(lambda: _queued(redis_url) == (0, 0))
        with pytest.raises(AssertionError):
            wait_until(lambda: len(cb.received) > 1, timeout=3)
        assert "refused async call" in async_rt.log_path.read_text()
    finally:
        cb.close()


def test_the_runtime_runs_while_its_redis_is_down_and_queues_once_it_is_up(
    tmp_path: Path, callbacks: Callbacks
) -> None:
    # the port is held until the server starts: the runtime and its replica draw theirs meanwhile
    held = HeldPort()
    server = RedisServer(data_dir=tmp_path / "redis", port=held.port)
    server.prepare()  # its users' credentials files; the server is not running yet
    url = RedisURL(server.url)
    url.server = server
    rt = _runtime(tmp_path / "rt", url).start()
    try:
        with_function_token(rt)
        _deploy_echo(rt)
        with client(rt) as http:
            r = http.post("/async-function/echo", headers={"X-Callback-Url": callbacks.url})
            assert r.status_code == 503 and r.json()["error"] == "queue_unavailable", r.text
            assert http.post("/function/echo", content=b"sync").content == b"sync"
            held.release()
            server.start()
            r = http.post(
                "/async-function/echo", headers={"X-Callback-Url": callbacks.url}, content=b"up"
            )
            assert r.status_code == 202, r.text
        wait_until(lambda: len(callbacks.received) == 1, timeout=30)
        assert callbacks.received[0][1] == b"up"
    finally:
        rt.stop()
        server.stop()
        held.release()


def test_a_runtime_with_redis_but_no_credentials_file_does_not_start(
    tmp_path: Path, redis_url: RedisURL
) -> None:
    rt = _runtime(tmp_path / "rt", redis_url, redis_credentials_file=tmp_path / "missing.json")
    with pytest.raises(ServiceError):
        rt.start(timeout=20)
    assert "missing.json" in rt.log_path.read_text()


def test_bad_async_settings_are_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.settings import RuntimeSettings

    for flag, value in (("--async-workers", "0"), ("--async-max-attempts", "-1")):
        with pytest.raises(SystemExit) as exc:
            RuntimeSettings.from_argv(["--auth-dir", str(tmp_path), flag, value])
        assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_fedfaas_up_gives_the_runtime_its_redis_user(tmp_path: Path) -> None:
    from fedfaas.platform.parts import RUNTIME, redis_credentials
    from runtime.settings import RuntimeSettings

    ctx = part_context(tmp_path)
    settings, _ = RuntimeSettings.from_argv(RUNTIME.argv(ctx)[3:])
    assert settings.redis_url == "redis://127.0.0.1:1004/0"
    assert settings.redis_credentials_file == redis_credentials(ctx, "runtime")
    assert settings.redis_credentials_file.name == "redis-runtime.json"


def test_a_call_accepted_before_a_sigkill_is_delivered_once_after_a_restart(
    tmp_path: Path, redis_url: RedisURL
) -> None:
    # nothing listens there yet: the callback is refused; held, so that the runtime and its
    # replicas, started meanwhile, draw other ports
    held = HeldPort()
    url = f"http://127.0.0.1:{held.port}/cb"
    rt = _runtime(tmp_path / "rt", redis_url, async_max_attempts=12).start()
    cb: Callbacks | None = None
    try:
        with_function_token(rt)
        _deploy_echo(rt)
        with client(rt) as http:
            r = http.post("/async-function/echo", headers={"X-Callback-Url": url}, content=b"kept")
            assert r.status_code == 202
        call_id = r.headers["x-call-id"]
        wait_until(lambda: "attempt 2 failed" in rt.log_path.read_text(), timeout=30)
        assert f"async call {call_id}: echo answered 200" in rt.log_path.read_text()
        assert rt.proc is not None
        os.killpg(rt.proc.pid, signal.SIGKILL)
        rt.proc.wait()
        rt.proc = None
        assert _queued(redis_url) == (1, 1)  # still there, held by the dead worker

        cb = Callbacks(port=held.release())
        rt.start()  # same port, secrets and Redis; functions do not outlive a runtime
        # the call is taken over; echo is not deployed yet, so its invocation is retried
        wait_until(lambda: "took over async call" in rt.log_path.read_text(), timeout=30)
        wait_until(lambda: "the runtime answered 404" in rt.log_path.read_text(), timeout=30)
        _deploy_echo(rt)
        wait_until(lambda: len(cb.received) == 1, timeout=60)
        headers, body = cb.received[0]
        assert body == b"kept" and headers["x-call-id"] == call_id
        wait_until(lambda: _queued(redis_url) == (0, 0))
        with pytest.raises(AssertionError):  # exactly once
            wait_until(lambda: len(cb.received) > 1, timeout=3)
        with client(rt) as http:  # at least once: the new runtime invoked echo again
            assert http.get("/system/function/echo").json()["invocationCount"] == 1
    finally:
        rt.stop()
        held.release()
        if cb is not None:
            cb.close()


def test_the_runtime_user_reaches_only_the_async_queue(redis_url: RedisURL) -> None:
    import redis

    with redis_url.client("runtime") as r:
        r.xadd(STREAM, {"k": "v"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.get("fedfaas:job:1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.flushall()
    with redis_url.client("gateway") as g, pytest.raises(redis.exceptions.NoPermissionError):
        g.xlen(STREAM)

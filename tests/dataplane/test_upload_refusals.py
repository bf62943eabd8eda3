"""Uploads a node cannot take just now: the gateway answers them (503 + ``Retry-After``, JSON),
never drops the connection, and the SDK waits and retries them, within bounds.

Regression: an upload whose store object the system refused (``OSError`` from the store:
/dev/shm full, out of file descriptors) raised out of the server's transport callback; the
event loop closed the connection without an answer and, the error being an ``OSError``,
logged nothing. The client saw ``httpx.RemoteProtocolError: Server disconnected without
sending a response`` (tests/platform/test_readme_job.py failed once on it under load), and the
upload's share of the memory budget was never given back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from client.sdk import FLClient, GatewayUnavailable, UploadReceipt
from core import wire
from gateway.http import Exchange, HttpServer, Request, Response
from tests.dataplane.gwproc import gateway_process
from tests.dataplane.gwutil import GatewayThread, tiny_bytes
from tests.dataplane.rawhttp import read_answer, send_head

pytestmark = pytest.mark.integration


def _create(url: str, admin: str) -> dict[str, str]:
    r = httpx.post(
        url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 2, "clients": "c0,c1"},
        content=tiny_bytes(0),
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def _upload_head(tokens: dict[str, str], client: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {tokens[client]}",
        "X-Client-Id": client,
        "X-Sample-Count": "1",
    }


@contextmanager
def _no_free_fd(pid: int) -> Iterator[None]:
    """Process ``pid`` can open no more file descriptors (its RLIMIT_NOFILE soft limit is its
    lowest free descriptor number) until the block ends."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    lowest = next(n for n in range(len(used) + 1) if n not in used)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))


def test_an_upload_the_store_cannot_allocate_for_is_answered_503_not_dropped(
    tmp_path: Path, redis_url: str
) -> None:
    # no pre-faulted buffers: the upload's object is a new file in the store
    with gateway_process(tmp_path, redis_url, pool=0) as (gw, admin):
        tokens = _create(gw.url, admin)
        data = tiny_bytes(1)
        head = "GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"
        s = socket.create_connection(("127.0.0.1", gw.settings.port), timeout=10)
        try:
            s.sendall(head.encode())  # the connection is accepted and served: keep-alive
            assert read_answer(s).status == 200
            target = "/v1/jobs/j1/rounds/1/updates"
            upload = [f"POST {target} HTTP/1.1", "Host: gateway", f"Content-Length: {len(data)}"]
            upload += [f"{k}: {v}" for k, v in _upload_head(tokens, "c0").items()]
            raw = ("\r\n".join(upload) + "\r\n\r\n").encode() + data
            with _no_free_fd(gw.pid):
                s.sendall(raw)
                answer = read_answer(s)  # before the fix: "connection closed before an answer"
            assert answer.status == 503, answer.body
            assert answer.headers["retry-after"] == "1"
            body = answer.json()
            assert body["error"] == "store_full", body
            assert "Too many open files" in body["detail"] and "retry after 1 s" in body["detail"]
            # the same connection goes on: the retry is accepted, nothing was held
            s.sendall(raw)
            assert read_answer(s).status == 202
        finally:
            s.close()
        metrics = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {admin}"}).text
        assert "fedfaas_gateway_body_bytes_held 0.0" in metrics
        assert "no store object for an update of client c0" in gw.log_path.read_text()


def _hold_budget(gw: GatewayThread, tokens: dict[str, str]) -> tuple[socket.socket, bytes]:
    """c0's upload in flight, part of its body sent: it holds the node's whole budget."""
    data = tiny_bytes(1)
    s = send_head(
        gw.gw.port,
        "POST",
        "/v1/jobs/j1/rounds/1/updates",
        _upload_head(tokens, "c0"),
        content_length=len(data),
        body=data[:40],
    )
    deadline = time.monotonic() + 30
    while gw.gw.jobs["j1"].inflight != {"c0"}:
        assert time.monotonic() < deadline, "c0's upload did not start"
        time.sleep(0.01)
    return s, data


@pytest.fixture()
def full_node(make_gw) -> GatewayThread:  # type: ignore[no-untyped-def]
    """A gateway whose memory budget holds one upload's object, not two."""
    nbytes = wire.ModelSpec.from_safetensors(tiny_bytes(0)).object_nbytes
    gw: GatewayThread = make_gw(max_inflight_bytes=nbytes + nbytes // 2, max_inflight=0)
    return gw


def test_the_sdk_retries_an_upload_refused_503_once_the_budget_has_room(
    full_node: GatewayThread, caplog: pytest.LogCaptureFixture
) -> None:
    gw = full_node
    tokens = _create(gw.url, gw.gw.secret)
    s, data = _hold_budget(gw, tokens)
    got: list[UploadReceipt | BaseException] = []

    def upload() -> None:
        try:
            with FLClient(gw.url, "j1", "c1", tokens["c1"]) as fl:
                got.append(fl.upload(1, tiny_bytes(2), 3))
        except BaseException as exc:  # reported by the assertion below
            got.append(exc)

    caplog.set_level(logging.WARNING, logger="client.sdk")
    t = threading.Thread(target=upload)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while gw.gw.budget.refused < 1:  # c1 was answered 503 at least once
            assert time.monotonic() < deadline and t.is_alive(), got
            time.sleep(0.01)
        s.sendall(data[40:])  # c0 finishes: its share of the budget comes back
        assert read_answer(s).status == 202
    finally:
        s.close()
        t.join(60)
    [receipt] = got
    assert isinstance(receipt, UploadReceipt), receipt
    assert receipt.client == "c1" and receipt.round == 1
    assert gw.gw.jobs["j1"].engine is not None and gw.gw.jobs["j1"].engine.accepted == 2
    assert any("c1: upload of round 1 refused for now" in r.message for r in caplog.records)


def test_the_sdk_gives_up_on_503s_after_its_total_wait(full_node: GatewayThread) -> None:
    gw = full_node
    tokens = _create(gw.url, gw.gw.secret)
    s, _ = _hold_budget(gw, tokens)
    try:
        with FLClient(gw.url, "j1", "c1", tokens["c1"]) as fl:
            t0 = time.monotonic()
            with pytest.raises(GatewayUnavailable) as err:
                fl.upload(1, tiny_bytes(2), 3, busy_wait=2.5)
            waited = time.monotonic() - t0
    finally:
        s.close()
    assert err.value.retry_after == 1.0 and "memory_budget" in err.value.reason
    # Retry-After is 1 s: two retries fit in 2.5 s, a third would not
    assert gw.gw.budget.refused == 3
    assert waited >= 2.0


class _Faulty(Exchange):
    """An exchange with a bug: ``start`` or ``buffer_updated`` raises ``ValueError``."""

    def __init__(self, req: Request, where: str, aborted: list[str]) -> None:
        self.req, self.where, self.aborted = req, where, aborted
        self.buf = bytearray(req.content_length or 0)
        self.fill = 0

    def start(self) -> None:
        if self.where == "start":
            raise ValueError("a bug before the body")

    def get_buffer(self) -> memoryview:
        return memoryview(self.buf)[self.fill :]

    def buffer_updated(self, n: int) -> None:
        self.fill += n
        if self.where == "body":
            raise ValueError("a bug in the body")

    async def complete(self) -> Response:
        return Response.json(200, {"path": self.req.path, "bytes": self.fill})

    def abort(self) -> None:
        self.aborted.append(self.req.path)


@pytest.mark.parametrize("where", ["start", "body"])
def test_an_exchange_that_raises_is_answered_500_and_the_connection_goes_on(where: str) -> None:
    aborted: list[str] = []
    loop = asyncio.new_event_loop()
    server = HttpServer(lambda req: _Faulty(req, where if req.path == "/bad" else "", aborted))
    port = loop.run_until_complete(server.start("127.0.0.1", 0))
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        s = send_head(port, "POST", "/bad", content_length=5, body=b"12345")
        try:
            answer = read_answer(s)  # before the fix: "connection closed before an answer"
            assert answer.status == 500, answer.body
            bug = "a bug before the body" if where == "start" else "a bug in the body"
            assert answer.json() == {"error": "internal", "detail": f"ValueError: {bug}"}
            s.sendall(b"POST /good HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            assert read_answer(s).json() == {"path": "/good", "bytes": 3}
        finally:
            s.close()
        assert aborted == ["/bad"]
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
        loop.close()

"""Proxy edge cases: HEAD, header bytes, callers and replicas that leave in the middle."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import FUNCTION_TOKEN, available, client, echo_body

pytestmark = pytest.mark.integration

HANDLER = """
import os
import time


def handle(event, context):
    if event.path == "/fixed":
        return {"body": b"hello head", "headers": {"Content-Type": "text/x-fixed"}}
    if event.path == "/header":
        return {"body": b"", "headers": {"X-Back": event.headers["x-name"]}}
    if event.path == "/forever":
        marker = event.query["marker"]

        def chunks():
            try:
                while True:
                    yield b"x" * 1024
                    time.sleep(0.01)
            finally:
                with open(marker, "w") as f:
                    f.write("closed")

        return chunks()
    if event.path == "/die":
        def dying():
            yield b"a" * 4096
            time.sleep(0.2)
            os._exit(1)

        return dying()
    return {"body": event.body}
"""


@pytest.fixture(scope="module")
def edge(runtime: RuntimeProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("edgefn")
    (folder / "handler.py").write_text(HANDLER)
    body = echo_body("edge", annotations={"com.fedfaas.handler": str(folder)})
    with client(runtime) as http:
        assert http.post("/system/functions", json=body).status_code == 202
        wait_until(lambda: available(http, "edge") == 1)
    return "edge"


def test_head_answers_the_headers_of_get_without_a_body(http: httpx.Client, edge: str) -> None:
    get = http.get(f"/function/{edge}/fixed")
    head = http.head(f"/function/{edge}/fixed")
    assert (get.status_code, get.content) == (200, b"hello head")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == str(len(b"hello head"))
    assert head.headers["content-type"] == "text/x-fixed"
    assert head.headers["x-call-id"] and head.headers["x-duration-seconds"]


def test_header_bytes_that_are_not_ascii_pass_through_both_ways(
    http: httpx.Client, edge: str
) -> None:
    value = "café ✓".encode()
    r = http.get(f"/function/{edge}/header", headers=[(b"X-Name", value)])
    assert r.status_code == 200
    assert dict(r.headers.raw)[b"x-back"] == value


def test_headers_named_by_connection_are_not_forwarded(http: httpx.Client, edge: str) -> None:
    r = http.get(
        f"/function/{edge}/header",
        headers={"Connection": "keep-alive, X-Name", "X-Name": "hop"},
    )
    # X-Name was hop-by-hop, so the replica never saw it and its handler failed looking for it
    assert r.status_code == 500 and r.headers["x-openfaas-internal"] == "of-watchdog"


def test_caller_leaving_mid_stream_stops_the_replica_generator(
    runtime: RuntimeProcess, edge: str, tmp_path: Path
) -> None:
    marker = tmp_path / "closed"
    with (
        client(runtime, timeout=30) as http,
        http.stream("GET", f"/function/{edge}/forever", params={"marker": str(marker)}) as r,
    ):
        assert r.status_code == 200
        got = 0
        for chunk in r.iter_raw():
            got += len(chunk)
            if got >= 16 * 1024:
                break
    # the runtime closed its upstream request, the replica saw it and closed the generator
    # the file exists from its open, before its write: wait for what it says
    wait_until(lambda: marker.exists() and marker.read_text() == "closed", timeout=15)


def test_caller_leaving_mid_upload_is_no_server_error(runtime: RuntimeProcess, edge: str) -> None:
    head = (
        f"POST /function/{edge} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {FUNCTION_TOKEN}\r\n"
        f"Content-Length: {64 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", runtime.port), timeout=10) as s:
        s.sendall(head + b"y" * (1024 * 1024))
    wait_until(lambda: "client left while sending its body" in runtime.log_path.read_text())
    assert "Exception in ASGI application" not in runtime.log_path.read_text()
    with client(runtime) as http:
        r = http.post(f"/function/{edge}", content=b"next one")
        assert (r.status_code, r.content) == (200, b"next one")


def test_replica_dying_mid_response_is_an_error_for_the_caller_not_a_short_body(
    http: httpx.Client, edge: str
) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(f"/function/{edge}/die")
    assert http.get("/healthz").status_code == 200
    wait_until(lambda: available(http, edge) == 1)
    r = http.post(f"/function/{edge}", content=b"replaced")
    assert (r.status_code, r.content) == (200, b"replaced")

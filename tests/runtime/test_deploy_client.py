"""`fedfaas deploy`: the faas-cli request sequence, against a recording gateway and the runtime."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.openfaas import AsyncOpenFaaS, OpenFaaS, OpenFaaSError
from core.stackfile import load_stack
from fedfaas.deploy import DeployError, deploy
from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import FN_AUTH, PASSWORD, STACK, USER


class _Recorder(ThreadingHTTPServer):
    """Answers each method with its status, or with its list's statuses in turn (the last one
    again once the list is used up)."""

    def __init__(self, replies: dict[str, int | list[int]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies = replies
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers),
                "body": json.loads(body) if body else None,
            }
        )
        reply = self.server.replies.get(self.command, 500)
        if isinstance(reply, list):
            reply = reply.pop(0) if len(reply) > 1 else reply[0]
        self.send_response(reply)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_PUT = do_POST = do_DELETE = do_GET = _any

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def recorder(request: pytest.FixtureRequest) -> Iterator[_Recorder]:
    server = _Recorder(getattr(request, "param", {"PUT": 404, "POST": 202, "DELETE": 202}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_deploy_sends_put_then_post_on_404_with_faas_cli_headers(recorder: _Recorder) -> None:
    results = deploy(STACK, recorder.url, filter="echo")
    assert [(r.function, r.method, r.status, r.ok) for r in results] == [
        ("echo", "POST", 202, True)
    ]
    put, post = recorder.seen
    expected = load_stack(STACK).functions["echo"].deployment()
    assert (put["method"], put["path"], put["body"]) == ("PUT", "/system/functions", expected)
    assert (post["method"], post["path"], post["body"]) == ("POST", "/system/functions", expected)
    for req in (put, post):
        assert req["headers"]["Content-Type"] == "application/json"
        assert req["headers"]["User-Agent"].startswith("fedfaas-cli/")
        assert req["headers"]["Authorization"] == "Bearer"


def test_replace_deletes_first_and_basic_auth_is_sent(recorder: _Recorder) -> None:
    deploy(STACK, recorder.url, auth=("u", "p"), replace=True, filter="echo")
    assert [r["method"] for r in recorder.seen] == ["DELETE", "PUT", "POST"]
    assert recorder.seen[0]["body"] == {"functionName": "echo", "namespace": ""}
    token = base64.b64encode(b"u:p").decode()
    assert all(r["headers"]["Authorization"] == f"Basic {token}" for r in recorder.seen)


@pytest.mark.parametrize("recorder", [{"PUT": 201}], indirect=True)
def test_only_200_and_202_count_as_success(recorder: _Recorder) -> None:
    with pytest.raises(DeployError) as err:
        deploy(STACK, recorder.url, filter="echo")
    assert err.value.results[0].status == 201
    assert [r["method"] for r in recorder.seen] == ["PUT"]


def test_filter_that_matches_nothing_sends_nothing(recorder: _Recorder) -> None:
    assert deploy(STACK, recorder.url, filter="nothing-*") == []
    assert recorder.seen == []


def test_default_gateway_yields_to_openfaas_url_unless_resolve_is_off(
    recorder: _Recorder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = tmp_path / "stack.yml"  # no provider.gateway
    stack.write_text(
        "provider: {name: openfaas}\nfunctions:\n  echo: {lang: python3-http, handler: ./echo, "
        "image: echo:1, fprocess: python index.py}\n"
    )
    other = _Recorder({"PUT": 202})
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        # the recorder stands at faas-cli's default address, which counts as "not set"
        monkeypatch.setattr("core.stackfile.DEFAULT_GATEWAY", recorder.url)
        monkeypatch.setenv("OPENFAAS_URL", other.url)
        [moved] = deploy(stack, recorder.url)
        assert moved.ok and [r["method"] for r in other.seen] == ["PUT"]
        assert recorder.seen == []

        [exact] = deploy(stack, recorder.url, resolve=False)
        assert exact.ok and [r["method"] for r in recorder.seen] == ["PUT", "POST"]
        assert len(other.seen) == 1
    finally:
        other.shutdown()
        other.server_close()


def test_resolve_off_needs_a_gateway_url() -> None:
    with pytest.raises(ValueError, match="needs the gateway_url"):
        deploy(STACK, None, resolve=False)


@pytest.mark.integration
def test_deploy_against_the_runtime_then_manage_with_the_client(runtime: RuntimeProcess) -> None:
    [first] = deploy(STACK, runtime.url, auth=runtime.auth, filter="echo")
    assert (first.method, first.status) == ("POST", 202)
    [again] = deploy(STACK, runtime.url, auth=runtime.auth, filter="echo")
    assert (again.method, again.status) == ("PUT", 202)
    with OpenFaaS(runtime.url, runtime.auth) as gw:
        wait_until(lambda: getattr(gw.function("echo"), "available_replicas", 0) >= 1)
        assert [f["name"] for f in gw.list_functions()].count("echo") == 1
        assert gw.invoke("echo", b"\x01\x02", headers=FN_AUTH).content == b"\x01\x02"
        assert gw.invoke("echo", b"\x01\x02").status_code == 401  # no function token
        gw.scale("echo", 2)
        assert gw.function("echo").replicas == 2  # type: ignore[union-attr]
        with pytest.raises(OpenFaaSError) as zero:
            gw.scale("echo", 0)
        assert zero.value.status == 400
        assert any(line["instance"].startswith("echo-") for line in gw.logs("echo"))
        assert gw.remove("echo") is True
        assert gw.function("echo") is None
        assert gw.remove("echo") is False


def test_sync_and_async_clients_send_the_same_requests() -> None:
    """One client, two ways of waiting: every call both have builds the same request."""
    import asyncio

    seen: dict[str, list[tuple[str, str, bytes, str | None]]] = {"sync": [], "async": []}

    def record(kind: str):  # type: ignore[no-untyped-def]
        def handler(request: httpx.Request) -> httpx.Response:
            seen[kind].append(
                (
                    request.method,
                    str(request.url),
                    request.content,
                    request.headers.get("Authorization"),
                )
            )
            if request.url.path == "/system/functions" and request.method == "GET":
                return httpx.Response(200, json=[])
            if request.url.path.startswith("/system/function/"):
                return httpx.Response(200, json={"name": "f", "replicas": 2})
            return httpx.Response(202)

        return handler

    with OpenFaaS(
        "http://gw:8080", ("u", "p"), namespace="fn", transport=httpx.MockTransport(record("sync"))
    ) as c:
        c.list_functions(), c.function("f"), c.scale("f", 3), c.remove("f")
        c.invoke("f", b"x", path="/a")
        c.invoke("f", b"x", path="/a", headers={"Authorization": "Bearer fn-token"})

    async def run() -> None:
        async with AsyncOpenFaaS(
            "http://gw:8080",
            ("u", "p"),
            namespace="fn",
            transport=httpx.MockTransport(record("async")),
        ) as c:
            await c.list_functions(), await c.function("f"), await c.scale("f", 3)
            await c.remove("f")
            await c.invoke("f", b"x", path="/a")
            await c.invoke("f", b"x", path="/a", headers={"Authorization": "Bearer fn-token"})

    asyncio.run(run())
    assert seen["sync"] == seen["async"] and len(seen["sync"]) == 6
    assert seen["sync"][2][2] == b'{"serviceName":"f","replicas":3,"namespace":"fn"}'
    assert seen["sync"][4][3] is None  # functions get no gateway credentials
    assert seen["sync"][5][3] == "Bearer fn-token"  # only the token the caller gives


@pytest.mark.integration
def test_deploy_needs_credentials_and_rejects_unknown_images(
    auth_runtime: RuntimeProcess, tmp_path: Path
) -> None:
    with pytest.raises(DeployError) as err:
        deploy(STACK, auth_runtime.url, filter="echo")
    assert err.value.results[0].status == 401
    [ok] = deploy(STACK, auth_runtime.url, auth=(USER, PASSWORD), filter="echo")
    assert ok.ok
    other = tmp_path / "stack.yml"
    other.write_text(
        "provider: {name: openfaas}\nfunctions:\n  stranger:\n    lang: python3-http\n"
        "    handler: ./x\n    image: docker.io/x/stranger:1\n    fprocess: python index.py\n"
    )
    with pytest.raises(DeployError) as err:
        deploy(other, auth_runtime.url, auth=(USER, PASSWORD))
    assert err.value.results[0].status == 400
    assert "unknown to this runtime" in err.value.results[0].message
    with httpx.Client(base_url=auth_runtime.url, auth=(USER, PASSWORD), trust_env=False) as http:
        assert (
            http.request("DELETE", "/system/functions", json={"functionName": "echo"}).status_code
            == 202
        )


FAST = (0.01, 0.02)  # retry delays short enough for a unit test


@pytest.mark.parametrize("recorder", [{"GET": [503, 502, 404], "PUT": 500}], indirect=True)
def test_a_read_failing_transiently_is_asked_again_and_a_deploy_is_not(recorder: _Recorder) -> None:
    with OpenFaaS(recorder.url, retry_delays_s=FAST) as gw:
        assert gw.function("echo") is None  # 503, 502, then the 404 that says "not deployed"
        assert gw.deploy({"service": "echo", "image": "echo:1"}).status == 500
    assert [r["method"] for r in recorder.seen] == ["GET", "GET", "GET", "PUT"]


@pytest.mark.parametrize("recorder", [{"POST": 500}], indirect=True)
def test_a_scale_failing_every_time_says_how_many_tries_were_made(recorder: _Recorder) -> None:
    with OpenFaaS(recorder.url, retry_delays_s=FAST) as gw, pytest.raises(OpenFaaSError) as err:
        gw.scale("evaluator", 3)
    assert err.value.status == 500 and "(3 tries)" in err.value.detail
    assert [r["path"] for r in recorder.seen] == ["/system/scale-function/evaluator"] * 3


@pytest.mark.parametrize("recorder", [{"POST": 403}], indirect=True)
def test_a_refused_scale_is_not_asked_again(recorder: _Recorder) -> None:
    with OpenFaaS(recorder.url, retry_delays_s=FAST) as gw, pytest.raises(OpenFaaSError) as err:
        gw.scale("evaluator", 3)
    assert err.value.status == 403 and "tries" not in err.value.detail
    assert len(recorder.seen) == 1


def test_a_provider_that_does_not_answer_is_asked_three_times() -> None:
    with OpenFaaS("http://127.0.0.1:9", retry_delays_s=FAST) as gw:  # discard port: refused
        with pytest.raises(OpenFaaSError) as err:
            gw.function("evaluator")
        assert err.value.status == 0 and "(3 tries)" in err.value.detail
        with pytest.raises(OpenFaaSError) as once:  # an invocation is never sent twice
            gw.invoke("evaluator", b"{}")
        assert "tries" not in once.value.detail


@pytest.mark.parametrize("recorder", [{"POST": [500, 202]}], indirect=True)
def test_the_async_client_asks_a_scale_again_after_a_500(recorder: _Recorder) -> None:
    async def scale() -> None:
        async with AsyncOpenFaaS(recorder.url, retry_delays_s=FAST) as gw:
            await gw.scale("aggregator", 2)

    asyncio.run(scale())
    assert [r["body"]["replicas"] for r in recorder.seen] == [2, 2]

"""The exact requests faas-cli deploy/list/describe/scale/invoke/remove send (reference section 7)."""

from __future__ import annotations

import re
import socket

import httpx
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import available, echo_body

pytestmark = pytest.mark.integration

# faas-cli after `faas-cli login` (the client fixture adds its basic auth on /system/*); without
# saved credentials it sends "Bearer " (empty token), which h11 will not send with the trailing
# space, so that one is checked over a raw socket below.
FAAS_CLI = {"Content-Type": "application/json", "User-Agent": "faas-cli/0.17.4"}


def test_faas_cli_deploy_list_describe_scale_invoke_remove_sequence(http: httpx.Client) -> None:
    body = echo_body("cli-seq")

    # deploy: PUT answers 404 for a new function, faas-cli then POSTs the same body
    r = http.put("/system/functions", json=body, headers=FAAS_CLI)
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"
    r = http.post("/system/functions", json=body, headers=FAAS_CLI)
    assert r.status_code == 202
    assert r.content == b""

    # faas-cli ready <fn>: describe until availableReplicas > 0
    wait_until(lambda: available(http, "cli-seq") == 1)

    # list
    r = http.get("/system/functions", headers=FAAS_CLI)
    assert r.status_code == 200
    listed = {f["name"]: f for f in r.json()}
    assert listed["cli-seq"]["image"] == body["image"]
    assert listed["cli-seq"]["replicas"] == 1

    # describe (faas-cli sends ?namespace=&usage=1)
    r = http.get(
        "/system/function/cli-seq", params={"namespace": "", "usage": "1"}, headers=FAAS_CLI
    )
    assert r.status_code == 200
    st = r.json()
    assert st["name"] == "cli-seq"
    assert st["namespace"] == "openfaas-fn"
    assert st["envProcess"] == "python index.py"
    assert st["labels"]["faas_function"] == "cli-seq"
    assert st["labels"]["com.openfaas.scale.max"] == "4"
    assert st["annotations"]["prometheus.io.scrape"] == "false"
    assert st["limits"] == {"memory": "1Gi", "cpu": "1"}
    assert st["replicas"] == 1 and st["availableReplicas"] == 1
    assert "invocationCount" not in st  # zero numbers are omitted (Go omitempty)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", st["createdAt"])

    # scale
    r = http.post(
        "/system/scale-function/cli-seq",
        json={"serviceName": "cli-seq", "replicas": 2, "namespace": ""},
        headers=FAAS_CLI,
    )
    assert r.status_code == 202
    assert http.get("/system/function/cli-seq").json()["replicas"] == 2
    wait_until(lambda: available(http, "cli-seq") == 2)

    # invoke (with the function token), through the namespace-qualified name too
    r = http.post(
        "/function/cli-seq", content=b"\x00hello\xff", headers={"Content-Type": "application/x-raw"}
    )
    assert r.status_code == 200
    assert r.content == b"\x00hello\xff"
    assert r.headers["content-type"] == "application/x-raw"
    assert r.headers["x-call-id"] and int(r.headers["x-start-time"]) > 0
    assert float(r.headers["x-duration-seconds"]) >= 0
    assert r.headers["x-served-by"].startswith("fedfaas-runtime/")
    r = http.get(
        "/function/cli-seq.openfaas-fn/sub/path", params={"x": "1"}, headers={"X-Call-Id": "abc"}
    )
    assert r.status_code == 200
    assert r.headers["x-call-id"] == "abc"
    assert r.json()["path"] == "/sub/path" and r.json()["query"] == {"x": "1"}
    assert http.get("/system/function/cli-seq").json()["invocationCount"] == 2

    # deploying again updates in place: PUT 202
    r = http.put("/system/functions", json=body, headers=FAAS_CLI)
    assert r.status_code == 202

    # remove
    r = http.request(
        "DELETE",
        "/system/functions",
        json={"functionName": "cli-seq", "namespace": ""},
        headers=FAAS_CLI,
    )
    assert r.status_code == 202
    r = http.get("/system/function/cli-seq")
    assert r.status_code == 404 and r.content == b""
    assert "cli-seq" not in {f["name"] for f in http.get("/system/functions").json()}


def test_info_namespaces_and_healthz_answer_like_openfaas(http: httpx.Client) -> None:
    info = http.get("/system/info").json()
    assert info["provider"]["orchestration"] == "process"
    assert info["version"]["release"]
    assert http.get("/system/namespaces").json() == ["openfaas-fn"]
    r = http.get("/healthz")
    assert r.status_code == 200 and r.content == b""


def test_faas_cli_without_login_gets_401_with_the_basic_realm(runtime: RuntimeProcess) -> None:
    """faas-cli sends an empty Bearer token when it has no credentials: the runtime asks for
    basic auth, as the OpenFaaS gateway does."""
    request = (
        b"GET /system/functions HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: faas-cli/0.17.4\r\n"
        b"Authorization: Bearer \r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", runtime.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 401")
    assert b'www-authenticate: basic realm="restricted"' in data.lower()


def test_logs_stream_the_replica_output_as_ndjson(http: httpx.Client) -> None:
    assert http.post("/system/functions", json=echo_body("cli-logs")).status_code == 202
    wait_until(lambda: available(http, "cli-logs") == 1)
    r = http.get("/system/logs", params={"name": "cli-logs", "follow": "false", "tail": "5"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [httpx.Response(200, content=line).json() for line in r.content.splitlines()]
    assert lines and all(x["name"] == "cli-logs" and x["instance"] == "cli-logs-0" for x in lines)
    assert any("listening" in x["text"] for x in lines)
    assert (
        http.request("DELETE", "/system/functions", json={"functionName": "cli-logs"}).status_code
        == 202
    )

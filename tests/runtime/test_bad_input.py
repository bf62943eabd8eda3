"""Bad input on every route gets the documented code and a clear message; the runtime keeps serving."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from runtime import RuntimeProcess
from tests.polling import wait_until
from tests.runtime.conftest import PASSWORD, USER, available, client, echo_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def echo_fn(runtime: RuntimeProcess) -> str:
    with client(runtime) as http:
        assert http.post("/system/functions", json=echo_body("bad-echo")).status_code == 202
        wait_until(lambda: available(http, "bad-echo") == 1)
    return "bad-echo"


@pytest.mark.parametrize("name", ["Bad_Name", "UPPER", "dotted.name", "-lead", "trail-", "a" * 64])
def test_deploy_with_a_name_that_is_not_rfc1123_is_rejected(http: httpx.Client, name: str) -> None:
    r = http.post("/system/functions", json=echo_body(name))
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_deployment"
    assert "RFC1123" in r.json()["detail"]


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "bad FunctionDeployment JSON"),
        (b"", "empty body"),
        (b'{"image": "x"}', "service"),
        (b'{"service": "x", "image": "y", "labels": ["a"]}', "labels"),
    ],
)
def test_malformed_deployment_json_is_a_400_that_says_what_is_wrong(
    http: httpx.Client, method: str, body: bytes, fragment: str
) -> None:
    r = http.request(
        method, "/system/functions", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"] == "invalid_request"
    assert fragment in r.json()["detail"]


def test_deploy_without_image_or_with_an_unknown_image_is_rejected(http: httpx.Client) -> None:
    r = http.post("/system/functions", json={"service": "noimage"})
    assert r.status_code == 400 and "image is required" in r.json()["detail"]
    r = http.post("/system/functions", json=echo_body("other", image="docker.io/someone/else:1"))
    assert r.status_code == 400
    assert r.json()["error"] == "unsupported_image"
    assert "add a function with this `image:`" in r.json()["detail"]
    assert http.get("/system/function/other").status_code == 404


def test_deploy_of_an_unsupported_lang_or_folder_without_handler_is_rejected(
    http: httpx.Client, tmp_path: Path
) -> None:
    r = http.post(
        "/system/functions", json=echo_body("nodefn", annotations={"com.fedfaas.lang": "node18"})
    )
    assert r.status_code == 400 and "node18" in r.json()["detail"]
    r = http.post(
        "/system/functions",
        json=echo_body("nohandler", annotations={"com.fedfaas.handler": str(tmp_path)}),
    )
    assert r.status_code == 400 and "no handler.py" in r.json()["detail"]


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ({"com.openfaas.scale.min": "3", "com.openfaas.scale.max": "2"}, "above"),
        ({"com.openfaas.scale.min": "many"}, "integer"),
        ({"com.openfaas.scale.max": "0"}, ">= 1"),
        ({"com.openfaas.scale.zero": "true"}, "scale to zero"),
    ],
)
def test_deploy_with_bad_scaling_labels_is_rejected(
    http: httpx.Client, labels: dict[str, str], fragment: str
) -> None:
    r = http.post("/system/functions", json=echo_body("badlabels", labels=labels))
    assert r.status_code == 400 and fragment in r.json()["detail"]


def test_deploy_into_another_namespace_is_rejected(http: httpx.Client) -> None:
    r = http.post("/system/functions", json=echo_body("nsfn", namespace="team-a"))
    assert r.status_code == 400
    assert "namespace must be: openfaas-fn" in r.json()["detail"]
    assert http.get("/system/function/x.team-a").status_code == 400
    assert http.get("/system/functions", params={"namespace": "team-a"}).status_code == 400


def test_second_post_of_an_existing_function_is_a_conflict(
    http: httpx.Client, echo_fn: str
) -> None:
    r = http.post("/system/functions", json=echo_body(echo_fn))
    assert r.status_code == 409 and "PUT" in r.json()["detail"]


def test_unknown_functions_are_404_on_every_route(http: httpx.Client) -> None:
    assert http.put("/system/functions", json=echo_body("ghost")).status_code == 404
    r = http.request("DELETE", "/system/functions", json={"functionName": "ghost"})
    assert r.status_code == 404 and "ghost" in r.json()["detail"]
    r = http.get("/system/function/ghost")
    assert r.status_code == 404 and r.content == b""
    assert http.post("/system/scale-function/ghost", json={"replicas": 2}).status_code == 404
    assert http.get("/system/logs", params={"name": "ghost"}).status_code == 404
    r = http.post("/function/ghost", content=b"x")
    assert r.status_code == 404
    assert r.text == "error finding function ghost.openfaas-fn: not found"


def test_delete_needs_a_body_with_a_function_name(http: httpx.Client) -> None:
    r = http.request("DELETE", "/system/functions")
    assert r.status_code == 400 and "empty body" in r.json()["detail"]
    r = http.request("DELETE", "/system/functions", json={"namespace": "openfaas-fn"})
    assert r.status_code == 400 and "functionName" in r.json()["detail"]


def test_scale_to_zero_is_refused_and_scale_above_max_is_clamped(
    http: httpx.Client, echo_fn: str
) -> None:
    r = http.post(f"/system/scale-function/{echo_fn}", json={"serviceName": echo_fn, "replicas": 0})
    assert r.status_code == 400
    assert "replicas cannot be set to 0 in OpenFaaS CE" in r.json()["detail"]
    r = http.post(f"/system/scale-function/{echo_fn}", content=b"{bad")
    assert r.status_code == 400
    r = http.post(f"/system/scale-function/{echo_fn}", json={"replicas": -1})
    assert r.status_code == 400
    r = http.post(
        f"/system/scale-function/{echo_fn}", json={"serviceName": echo_fn, "replicas": 50}
    )
    assert r.status_code == 202
    assert http.get(f"/system/function/{echo_fn}").json()["replicas"] == 4  # com.openfaas.scale.max
    assert http.post(f"/system/scale-function/{echo_fn}", json={"replicas": 1}).status_code == 202
    assert http.get(f"/system/function/{echo_fn}").json()["replicas"] == 1


def test_bad_log_queries_are_400(http: httpx.Client, echo_fn: str) -> None:
    assert http.get("/system/logs").status_code == 400
    r = http.get("/system/logs", params={"name": echo_fn, "since": "yesterday"})
    assert r.status_code == 400 and "RFC3339" in r.json()["detail"]
    assert http.get("/system/logs", params={"name": echo_fn, "tail": "x"}).status_code == 400


def test_invoking_a_function_with_no_ready_replica_is_503(
    http: httpx.Client, tmp_path: Path
) -> None:
    fdir = tmp_path / "never"
    fdir.mkdir()
    (fdir / "handler.py").write_text(
        "import time\ntime.sleep(3600)\n\ndef handle(event, context):\n    return 'x'\n"
    )
    body = echo_body("never-ready", annotations={"com.fedfaas.handler": str(fdir)})
    assert http.post("/system/functions", json=body).status_code == 202
    r = http.post("/function/never-ready", content=b"x")  # the runtime waits --ready-wait (2s)
    assert r.status_code == 503
    assert r.text == "No endpoints available for: never-ready."
    assert r.headers["x-openfaas-internal"] == "proxy"
    st = http.get("/system/function/never-ready").json()
    assert st["replicas"] == 1 and "availableReplicas" not in st
    assert (
        http.request(
            "DELETE", "/system/functions", json={"functionName": "never-ready"}
        ).status_code
        == 202
    )


@pytest.mark.parametrize("method", ["TRACE", "PROPFIND", "CONNECT"])
def test_unsupported_invoke_methods_are_405(http: httpx.Client, echo_fn: str, method: str) -> None:
    r = http.request(method, f"/function/{echo_fn}")
    assert r.status_code == 405


def test_wrong_credentials_get_401_with_the_basic_realm(auth_runtime: RuntimeProcess) -> None:
    with httpx.Client(base_url=auth_runtime.url, trust_env=False) as http:
        for auth in (None, (USER, "wrong"), ("root", PASSWORD)):
            r = http.get("/system/functions", auth=auth)
            assert r.status_code == 401
            assert r.json() == {"error": "unauthorized", "detail": "invalid credentials"}
            assert r.headers["www-authenticate"] == 'Basic realm="Restricted"'
        r = http.get("/system/functions", headers={"Authorization": "Basic !!notbase64"})
        assert r.status_code == 401
        r = http.post(
            "/system/functions", json=echo_body("authfn"), headers={"Authorization": "Bearer"}
        )
        assert r.status_code == 401
        assert http.get("/system/functions", auth=(USER, PASSWORD)).status_code == 200
        assert http.get("/healthz").status_code == 200
        # the runtime leaves /function/* to the functions (each checks its token): an unknown
        # function is a 404, not a 401
        assert http.post("/function/nothing", content=b"x").status_code == 404


def test_runtime_keeps_serving_after_bad_input(http: httpx.Client, echo_fn: str) -> None:
    for junk in (b"\xff\xfe", b"[]", b"null", b'{"service": 5}'):
        assert http.post("/system/functions", content=junk).status_code == 400
    assert http.get("/healthz").status_code == 200
    r = http.post(f"/function/{echo_fn}", content=b"still here")
    assert r.status_code == 200 and r.content == b"still here"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/system/no-such-route", 404, "not_found"),
        ("GET", "/nothing-here", 404, "not_found"),
        ("PATCH", "/system/functions", 405, "method_not_allowed"),
    ],
)
def test_a_path_or_method_no_route_serves_is_a_json_error(
    http: httpx.Client, method: str, path: str, status: int, code: str
) -> None:
    r = http.request(method, path)
    assert r.status_code == status, r.text
    assert r.json()["error"] == code and path in r.json()["detail"]

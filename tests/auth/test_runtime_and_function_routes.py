"""The embedded runtime's ``/system/*`` routes need basic auth, and the functions need the
function token, on every route but the health checks.

The runtime's routes come from its app's route table (``create_app().routes``), so a route added
later without auth fails here; the requests go to a real runtime process. The functions are the
real ``aggregator`` and ``flstore`` handlers deployed on that runtime.
"""

from __future__ import annotations

import re
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.openfaas import FUNCTION_TOKEN_SECRET
from core.stackfile import PLATFORM_STACK, load_stack
from runtime import RuntimeProcess, create_app
from runtime.auth import BasicAuth
from runtime.settings import RuntimeSettings
from tests.polling import wait_until
from tests.runtime.conftest import (
    FN_AUTH,
    FUNCTION_TOKEN,
    REPO,
    STACK,
    available,
    with_function_token,
)

pytestmark = pytest.mark.integration

#: the routes outside /system/*: the health check, and /function/* and /async-function/* (the
#: function token is checked: by the function, and for an asynchronous call also when it is queued)
OPEN = {"/healthz"}
#: outside /system/*, guarded by its basic auth too: the gateway's metrics
BASIC_AUTH_OUTSIDE = {"/metrics"}
ANY_METHOD = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}
PREFIXES = ("/function", "/async-function")
FUNCTION_ROUTES = {f"{p}/{{name}}{rest}" for p in PREFIXES for rest in ("", "/{path:path}")}
WRONG = {
    "no credential": {},
    "wrong basic auth": {"Authorization": "Basic " + "YWRtaW46d3Jvbmc="},  # admin:wrong
    "another service's bearer token": FN_AUTH,
}


def _route_table() -> list[Any]:
    """Every route of the runtime app, those of included routers too (FastAPI keeps an
    included router as one entry whose ``effective_candidates()`` are its routes)."""
    out = []
    with tempfile.TemporaryDirectory() as auth_dir:
        BasicAuth.ensure_dir(Path(auth_dir))
        routes = create_app(RuntimeSettings(auth_dir=Path(auth_dir))).routes
    for route in routes:
        inner = getattr(route, "effective_candidates", None)
        out.extend(inner() if callable(inner) else [route])
    assert all(r.path for r in out), out
    return out


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the runtime app, path parameters filled in."""
    return [
        (method, re.sub(r"\{[^}]+\}", "x", r.path))
        for r in _route_table()
        for method in sorted(r.methods or ANY_METHOD)  # None: the route takes every method
    ]


def test_the_route_table_has_no_route_outside_system_but_health_and_functions() -> None:
    paths = {r.path for r in _route_table()}
    outside = {p for p in paths if not p.startswith("/system/")}
    assert outside == OPEN | FUNCTION_ROUTES | BASIC_AUTH_OUTSIDE
    assert {"/system/secrets", "/system/functions"} <= paths


@pytest.fixture(scope="module")
def runtime_extra() -> dict[str, Any]:
    """More settings of the runtime (none here; tests/tls serves it and its replicas over
    TLS)."""
    return {}


@pytest.fixture(scope="module")
def verify() -> ssl.SSLContext | bool:
    """How the clients here verify the runtime (tests/tls: the platform's CA)."""
    return True


@pytest.fixture(scope="module")
def runtime(
    tmp_path_factory: pytest.TempPathFactory,
    runtime_extra: dict[str, Any],
    verify: ssl.SSLContext | bool,
) -> Iterator[RuntimeProcess]:
    """A runtime with basic auth, the function token secret, and the real aggregator and
    flstore functions deployed."""
    rt = RuntimeProcess(
        stack=STACK, state_dir=tmp_path_factory.mktemp("rt"), settings=runtime_extra
    ).start()
    try:
        with_function_token(rt, verify)
        aggregator = load_stack(PLATFORM_STACK).functions["aggregator"].deployment()
        flstore = {
            "service": "flstore-cache-0",
            "image": "fedfaas/flstore-cache:latest",
            "annotations": {"com.fedfaas.handler": str(REPO / "functions" / "flstore")},
            "secrets": [FUNCTION_TOKEN_SECRET],
        }
        with httpx.Client(base_url=rt.url, auth=rt.auth, trust_env=False, verify=verify) as http:
            for body in (aggregator, flstore):
                r = http.post("/system/functions", json=body)
                assert r.status_code == 202, r.text
            for name in ("aggregator", "flstore-cache-0"):
                wait_until(lambda n=name: available(http, n) == 1, timeout=60)  # type: ignore[misc]
        yield rt
    finally:
        rt.stop()


@pytest.mark.parametrize(
    ("method", "path"),
    [c for c in _routes() if c[1].startswith("/system") or c[1] in BASIC_AUTH_OUTSIDE],
)
def test_every_system_route_refuses_missing_and_wrong_credentials(
    runtime: RuntimeProcess, verify: ssl.SSLContext | bool, method: str, path: str
) -> None:
    with httpx.Client(base_url=runtime.url, trust_env=False, timeout=30, verify=verify) as http:
        for what, headers in WRONG.items():
            r = http.request(method, path, headers=headers, content=b'{"name": "x"}')
            assert r.status_code == 401, (what, method, path, r.status_code)
            if method != "HEAD":  # a HEAD answer has no body
                assert r.json() == {"error": "unauthorized", "detail": "invalid credentials"}
            assert r.headers["www-authenticate"] == 'Basic realm="Restricted"'
        ok = http.request(method, path, auth=runtime.auth, content=b'{"name": "x"}')
        assert ok.status_code != 401, (method, path)


def test_the_health_check_is_open(runtime: RuntimeProcess, verify: ssl.SSLContext | bool) -> None:
    assert httpx.get(f"{runtime.url}/healthz", trust_env=False, verify=verify).status_code == 200


FLSTORE_ROUTES = [
    ("GET", "/"),
    ("GET", "/ping"),
    ("GET", "/healthz"),
    ("GET", "/objects"),
    ("POST", "/load"),
    ("POST", "/evict"),
    ("POST", "/run"),
    ("GET", "/no-such-route"),
]
AGGREGATOR_ROUTES = [("GET", ""), ("GET", "/status"), ("POST", ""), ("PUT", "/x")]
FUNCTION_CASES = [("flstore-cache-0", m, p) for m, p in FLSTORE_ROUTES] + [
    ("aggregator", m, p) for m, p in AGGREGATOR_ROUTES
]
BAD_TOKENS = {
    "no token": {},
    "wrong token": {"Authorization": "Bearer not-the-function-token"},
    "basic auth of the gateway": {"Authorization": "Basic YWRtaW46czNjcmV0LXBhNTU="},
    "token without a scheme": {"Authorization": FUNCTION_TOKEN},
}


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("fn", "method", "path"), FUNCTION_CASES)
def test_every_function_route_needs_the_function_token(
    runtime: RuntimeProcess,
    verify: ssl.SSLContext | bool,
    prefix: str,
    fn: str,
    method: str,
    path: str,
) -> None:
    body = b'{"objects": [], "workload": "mean", "params": {}}'
    url = f"{prefix}/{fn}{path}"
    with httpx.Client(base_url=runtime.url, trust_env=False, timeout=60, verify=verify) as http:
        for what, headers in BAD_TOKENS.items():
            r = http.request(method, url, headers=headers, content=body)
            assert r.status_code == 401, (what, url, method, r.status_code, r.text)
            assert r.json()["error"] == "unauthorized" and r.json()["detail"], what
            assert r.headers["www-authenticate"] == "Bearer"
        r = http.request(method, url, headers=FN_AUTH, content=body)
        assert r.status_code != 401, (url, method, r.text)


@pytest.mark.parametrize("fn", ["flstore-cache-0", "aggregator"])
def test_the_watchdog_health_path_stays_open(
    runtime: RuntimeProcess, verify: ssl.SSLContext | bool, fn: str
) -> None:
    for path in ("/_/health", "/_/ready"):
        r = httpx.get(f"{runtime.url}/function/{fn}{path}", trust_env=False, verify=verify)
        assert r.status_code == 200 and r.content == b"OK", (fn, path)


def test_right_token_reaches_the_handlers(
    runtime: RuntimeProcess, verify: ssl.SSLContext | bool
) -> None:
    with httpx.Client(
        base_url=runtime.url, trust_env=False, timeout=60, headers=FN_AUTH, verify=verify
    ) as http:
        ping = http.get("/function/flstore-cache-0/ping")
        assert ping.status_code == 200 and ping.json()["ok"] is True
        agg = http.get("/function/aggregator")
        assert agg.status_code == 200 and "endpoints" in agg.json()
        assert http.post("/function/aggregator").status_code == 405


def test_function_secrets_folder_holds_only_the_token(runtime: RuntimeProcess) -> None:
    folder = Path(runtime.state_dir) / "function-secrets" / "flstore-cache-0"
    assert sorted(p.name for p in folder.iterdir()) == [FUNCTION_TOKEN_SECRET]
    assert (folder / FUNCTION_TOKEN_SECRET).read_text() == FUNCTION_TOKEN


def test_engine_and_tracker_refuse_to_start_without_a_function_token_file(tmp_path: Path) -> None:
    from cache_engine.engine import CacheEngine
    from cache_engine.settings import EngineSettings
    from core.auth import AuthConfigError
    from request_tracker.settings import TrackerSettings
    from request_tracker.tracker import Tracker

    with pytest.raises(AuthConfigError, match="function-token-file"):
        CacheEngine(EngineSettings(), None, None, None)  # type: ignore[arg-type]
    with pytest.raises(AuthConfigError, match="function-token-file"):
        Tracker(TrackerSettings(), None)
    with pytest.raises(AuthConfigError, match="function token file"):
        Tracker(TrackerSettings(function_token_file=tmp_path / "missing"), None)

"""Every route of every FastAPI service but the health check needs a credential.

Walks ``app.routes``, every kind of route (a route added later without ``require(...)`` fails
here, and so does one that is no ``APIRoute`` at all, such as FastAPI's ``/docs``, ``/redoc`` and
``/openapi.json`` or a mount), and sends each route no credential, a wrong one and a valid
credential of a scope the route does not allow.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from cache_engine.service import create_app as engine_app
from cache_engine.settings import EngineSettings
from control_plane.api import create_app as control_app
from control_plane.settings import ControlPlaneSettings
from core.auth import (
    AuthConfigError,
    Authenticator,
    Scope,
    bearer,
    client_token,
    require,
    write_token_file,
)
from core.openfaas import OpenFaaSError
from core.secretfiles import Credentials, write_credentials
from request_tracker.service import create_app as tracker_app
from request_tracker.settings import TrackerSettings
from tests.auth.routes import guard_of, methods, route_of

OPEN = {"/healthz"}


def _tokens(tmp: Path) -> dict[Scope, Path]:
    return {s: write_token_file(tmp / s.value, f"{s.value}-token") for s in Scope}


def _control(t: dict[Scope, Path]) -> FastAPI:
    return control_app(
        ControlPlaneSettings(
            gateways="n1=http://127.0.0.1:1",
            admin_token_file=t[Scope.ADMIN],
            analyst_token_file=t[Scope.ANALYST],
        )
    )


def _creds(t: dict[Scope, Path], name: str) -> Path:
    """A credentials file (the apps read it at start; these tests reach no MinIO or Redis)."""
    return write_credentials(t[Scope.ADMIN].parent / name, Credentials("user", "password"))


def _engine(t: dict[Scope, Path]) -> FastAPI:
    return engine_app(
        EngineSettings(
            admin_token_file=t[Scope.ADMIN],
            service_token_file=t[Scope.SERVICE],
            minio_credentials_file=_creds(t, "minio.json"),
            redis_credentials_file=_creds(t, "redis.json"),
        )
    )


def _tracker(t: dict[Scope, Path]) -> FastAPI:
    return tracker_app(
        TrackerSettings(
            admin_token_file=t[Scope.ADMIN],
            analyst_token_file=t[Scope.ANALYST],
            redis_credentials_file=_creds(t, "redis.json"),
        )
    )


SERVICES: dict[str, Callable[[dict[Scope, Path]], FastAPI]] = {
    "control_plane": _control,
    "cache_engine": _engine,
    "tracker": _tracker,
}


def _cases() -> list[tuple[str, str, str]]:
    """(service, method, path) of every route of every kind but the open ones."""
    tokens = _tokens(Path(__import__("tempfile").mkdtemp()))
    out = []
    for name, build in SERVICES.items():
        for r in build(tokens).routes:
            path = getattr(r, "path", repr(r))
            if path not in OPEN:
                out.extend((name, m, path) for m in methods(r))
    return out


def _assert_refused(resp, status: int) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["error"] == ("unauthorized" if status == 401 else "forbidden")
    assert body["detail"]
    if status == 401:
        assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("service", "method", "path"), _cases())
def test_route_refuses_missing_wrong_and_other_scope_credentials(
    tmp_path: Path, service: str, method: str, path: str
) -> None:
    tokens = _tokens(tmp_path)
    app = SERVICES[service](tokens)
    guard = guard_of(route_of(app, method, path), require)
    url = re.sub(r"\{[^}]+\}", "x", path) + "?client=c"
    client = TestClient(app)  # no lifespan: auth must answer before any resource is touched
    _assert_refused(client.request(method, url), 401)
    _assert_refused(client.request(method, url, headers=bearer("wrong")), 401)
    _assert_refused(client.request(method, url, headers={"Authorization": "Basic eDp5"}), 401)
    # a service knows only the scopes its callers use; to check the guard itself, let this one
    # recognise every scope, then send each scope the route does not admit
    app.state.auth = Authenticator(
        {s: f"{s.value}-token" for s in Scope if s != Scope.CLIENT}, job_salt=lambda job: "salt"
    )
    others = sorted(set(Scope) - guard.scopes)
    assert others, f"{path} admits every scope"
    for other in others:
        if other == Scope.CLIENT:
            if "{job}" not in path:
                continue  # a client token names its job: elsewhere it is just a wrong token
            secret = client_token("admin-token", "x", "salt", "c")
        else:
            secret = tokens[other].read_text()
        _assert_refused(client.request(method, url, headers=bearer(secret)), 403)


def test_every_service_has_guarded_routes() -> None:
    services = {c[0] for c in _cases()}
    assert services == set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_the_health_check_is_the_only_open_route_and_there_is_no_schema_or_docs(
    tmp_path: Path, service: str
) -> None:
    app = SERVICES[service](_tokens(tmp_path))
    open_routes = {r.path for r in app.routes if isinstance(r, APIRoute) and r.path in OPEN}
    assert open_routes == OPEN
    client = TestClient(app)
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert client.get(path).status_code in (401, 404), path


def test_the_route_walk_refuses_a_route_of_another_kind() -> None:
    """FastAPI's default docs are starlette Routes, not APIRoutes: the walk must see them."""
    app = FastAPI()
    kinds = {getattr(r, "path", "") for r in app.routes if not isinstance(r, APIRoute)}
    assert {"/openapi.json", "/docs", "/redoc"} <= kinds
    for r in app.routes:
        with pytest.raises(AssertionError, match="nothing guards it"):
            guard_of(r, require)


def _salted(salts: dict[str, str]) -> Authenticator:
    return Authenticator({Scope.ADMIN: "admin-token"}, job_salt=salts.get)


def _scope(auth: Authenticator, job: str, client: str, token: str) -> Scope | None:
    app = FastAPI()
    seen: list[Scope | None] = []

    @app.get("/v1/jobs/{job}")
    def probe(request: Request, job: str) -> None:
        seen.append(auth.scope_of(token, request))

    TestClient(app).get(f"/v1/jobs/{job}", params={"client": client})
    return seen[0]


def test_a_client_token_proves_its_own_job_and_client_only() -> None:
    auth = _salted({"x": "s1", "y": "s2"})
    token = client_token("admin-token", "x", "s1", "c")
    assert _scope(auth, "x", "c", token) == Scope.CLIENT
    assert _scope(auth, "x", "c2", token) is None  # another client of the job
    assert _scope(auth, "y", "c", token) is None  # another job
    assert _scope(auth, "z", "c", token) is None  # a job the service does not know


def test_a_client_token_of_an_earlier_job_of_the_same_name_is_refused() -> None:
    old = client_token("admin-token", "x", "s-old", "c")
    assert _scope(_salted({"x": "s-new"}), "x", "c", old) is None
    assert _scope(_salted({"x": "s-new"}), "x", "c", client_token("admin-token", "x", "s-new", "c"))


def test_without_a_salt_lookup_no_client_token_is_admitted() -> None:
    auth = Authenticator({Scope.ADMIN: "admin-token"})
    assert Scope.CLIENT not in auth.scopes
    assert _scope(auth, "x", "c", client_token("admin-token", "x", "", "c")) is None


def test_client_token_opens_only_its_own_assignment(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path)
    app = _control(tokens)
    client = TestClient(app)
    app.state.auth = _salted({"x": "salt"})  # as if the control plane knew job x
    other = client_token("admin-token", "x", "salt", "c2")
    _assert_refused(client.get("/v1/jobs/x/assignment?client=c", headers=bearer(other)), 401)
    _assert_refused(client.get("/v1/jobs/y/assignment?client=c", headers=bearer(other)), 401)


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_missing_or_empty_admin_token_file_stops_the_service_at_start(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "admin"
    if content is not None:
        write_token_file(path, content)
    with pytest.raises(AuthConfigError, match=str(path)):
        engine_app(EngineSettings(admin_token_file=path))
    with pytest.raises(AuthConfigError, match="admin token file"):
        tracker_app(TrackerSettings())


def test_an_engine_given_a_runtime_auth_folder_without_its_files_stops_at_start(
    tmp_path: Path,
) -> None:
    """Never a silent fall back to unauthenticated calls to the provider's /system/*."""
    t = _tokens(tmp_path)
    empty = tmp_path / "no-basic-auth"
    empty.mkdir()
    settings = EngineSettings(
        admin_token_file=t[Scope.ADMIN],
        service_token_file=t[Scope.SERVICE],
        minio_credentials_file=_creds(t, "minio.json"),
        redis_credentials_file=_creds(t, "redis.json"),
        runtime_auth_dir=str(empty),
    )
    with pytest.raises(OpenFaaSError, match="basic-auth"):
        engine_app(settings)

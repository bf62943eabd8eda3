"""The route walk of ``test_routes_need_credentials.py``, for the console (cookie logins).

Every route of every kind but the open ones (health, the login form and the two static files,
which hold no data) must carry the console's guard (``require_session``); each is sent no
session, a made-up session cookie and the admin's bearer token (a service's credential, not a
login here), and refused every time; an analyst session is refused (403) on the admin's
routes, and a session without the CSRF token is refused (403) on every state change.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from console.app import create_app
from console.sessions import COOKIE, CSRF_HEADER, SAFE_METHODS, require_session
from console.settings import ConsoleSettings
from core.auth import Scope, bearer, write_token_file
from tests.auth.routes import guard_of, methods, route_of

OPEN = {("GET", "/healthz"), ("GET", "/login"), ("POST", "/login"), ("GET", "/static/{name}")}
TOKENS = {Scope.ADMIN: "admin-token", Scope.ANALYST: "analyst-token"}


def _app(tmp: Path) -> FastAPI:
    files = {s: write_token_file(tmp / s.value, v) for s, v in TOKENS.items()}
    return create_app(
        ConsoleSettings(
            admin_token_file=files[Scope.ADMIN], analyst_token_file=files[Scope.ANALYST]
        )
    )


def _cases() -> list[tuple[str, str]]:
    import tempfile

    app = _app(Path(tempfile.mkdtemp()))
    return [
        (m, getattr(r, "path", repr(r)))
        for r in app.routes
        for m in methods(r)
        if (m, getattr(r, "path", repr(r))) not in OPEN and m != "HEAD"
    ]


def _refused_without_login(resp, method: str, path: str) -> None:
    if method == "GET" and not path.startswith("/api/"):  # a page: to the login form
        assert resp.status_code == 303 and resp.headers["location"] == "/login", resp.text
    else:
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"] == "unauthorized" and resp.json()["detail"]


def _csrf(client: TestClient, token: str) -> str:
    assert client.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
    page = client.get("/").text
    return page.split("name='csrf-token' content='", 1)[1].split("'", 1)[0]


@pytest.mark.parametrize(("method", "path"), _cases())
def test_console_route_refuses_no_login_a_forged_one_and_the_wrong_scope(
    tmp_path: Path, method: str, path: str
) -> None:
    app = _app(tmp_path)
    guard = guard_of(route_of(app, method, path), require_session)
    url = re.sub(r"\{[^}]+\}", "x", path)
    client = TestClient(app, base_url="http://127.0.0.1")
    _refused_without_login(client.request(method, url, follow_redirects=False), method, path)
    client.cookies.set(COOKIE, "made-up-session")
    _refused_without_login(client.request(method, url, follow_redirects=False), method, path)
    client.cookies.clear()
    resp = client.request(method, url, headers=bearer(TOKENS[Scope.ADMIN]), follow_redirects=False)
    _refused_without_login(resp, method, path)
    if Scope.ANALYST not in guard.scopes:  # the admin's: an analyst login is refused
        csrf = _csrf(client, TOKENS[Scope.ANALYST])
        resp = client.request(method, url, headers={CSRF_HEADER: csrf})
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", resp.text
        client.cookies.clear()
    if method not in SAFE_METHODS:  # a state change: the admin without the CSRF token
        _csrf(client, TOKENS[Scope.ADMIN])
        resp = client.request(method, url)
        assert resp.status_code == 403 and "CSRF" in resp.json()["detail"], resp.text


def test_the_walk_sees_every_page_and_api_route() -> None:
    paths = {p for _, p in _cases()}
    assert {"/", "/jobs", "/jobs/{job}", "/flstore", "/checkpoints"} <= paths
    assert {"/api/overview", "/api/jobs", "/api/queries", "/api/jobs/{job}/stop"} <= paths
    assert {"/api/checkpoints", "/logout"} <= paths


def test_the_open_routes_hold_no_data(tmp_path: Path) -> None:
    client = TestClient(_app(tmp_path))
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/static/console.js").status_code == 200
    assert client.get("/static/secrets").status_code == 404
    assert "csrf-token" not in client.get("/login").text

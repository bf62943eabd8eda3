"""The console's login, CSRF and Content-Security-Policy, on the real app (no browser).

The services behind it are not started: every check here answers before the console calls
one (the login, the guards), or shows that it got past the guard by the service's absence
(502 ``upstream``). ``tests/console/test_console_browser.py`` drives it in Chromium on a
running platform.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from console.app import MAX_LOGIN_BODY, MAX_QUERY_BODY, create_app
from console.pages import CSP
from console.sessions import COOKIE, CSRF_HEADER
from console.settings import ConsoleSettings
from core.auth import bearer, write_token_file
from core.services import free_port

ADMIN, ANALYST = "admin-secret-for-the-console", "analyst-token-for-the-console"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens: no service behind
    settings = ConsoleSettings(
        admin_token_file=write_token_file(tmp_path / "admin", ADMIN),
        analyst_token_file=write_token_file(tmp_path / "analyst", ANALYST),
        control_plane_url=dead,
        tracker_url=dead,
        runtime_url=dead,
    )
    return TestClient(create_app(settings), base_url="http://127.0.0.1")


def login(client: TestClient, token: str) -> str:
    """Log in; the CSRF token of the session (from the page's meta tag)."""
    resp = client.post("/login", data={"token": token}, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    page = client.get("/jobs").text
    return page.split("name='csrf-token' content='", 1)[1].split("'", 1)[0]


@pytest.mark.parametrize("path", ["/", "/jobs", "/jobs/j", "/flstore", "/checkpoints"])
def test_a_page_without_a_login_goes_to_the_login(client: TestClient, path: str) -> None:
    resp = client.get(path, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/login"


@pytest.mark.parametrize("path", ["/api/overview", "/api/jobs", "/api/jobs/j", "/api/checkpoints"])
def test_json_without_a_login_is_refused(client: TestClient, path: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 401 and resp.json()["error"] == "unauthorized"
    # a bearer token is the services' credential, not a login to the console
    assert client.get(path, headers=bearer(ADMIN)).status_code == 401


def test_a_wrong_token_gets_no_session(client: TestClient) -> None:
    resp = client.post("/login", data={"token": "not-it"}, follow_redirects=False)
    assert resp.status_code == 401 and "not the admin or analyst token" in resp.text
    assert COOKIE not in resp.cookies
    assert client.get("/api/jobs").status_code == 401


def test_a_token_in_the_url_is_no_login(client: TestClient) -> None:
    resp = client.post(f"/login?token={ADMIN}", follow_redirects=False)
    assert resp.status_code == 401 and COOKIE not in resp.cookies


def test_the_session_cookie_is_httponly_strict_and_holds_no_token(client: TestClient) -> None:
    resp = client.post("/login", data={"token": ADMIN}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/"
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= attrs
    assert ADMIN not in cookie
    page = client.get("/")
    assert page.status_code == 200 and "data-page='overview'" in page.text
    assert ADMIN not in page.text  # nor in the page


def test_a_state_change_needs_the_csrf_token(client: TestClient) -> None:
    csrf = login(client, ADMIN)
    for headers in ({}, {CSRF_HEADER: "forged"}):
        resp = client.post("/api/jobs/j/stop", headers=headers)
        assert resp.status_code == 403 and "CSRF" in resp.json()["detail"], resp.text
    # with it, the guard lets it through to the control plane, which is not there
    resp = client.post("/api/jobs/j/stop", headers={CSRF_HEADER: csrf})
    assert resp.status_code == 502 and resp.json()["service"] == "control-plane", resp.text
    resp = client.post("/logout")
    assert resp.status_code == 403  # logging out is a state change too
    assert client.post("/logout", headers={CSRF_HEADER: csrf}).status_code == 200
    assert client.get("/api/jobs").status_code == 401  # the session is gone


def test_the_analyst_may_not_stop_a_job(client: TestClient) -> None:
    csrf = login(client, ANALYST)
    resp = client.post("/api/jobs/j/stop", headers={CSRF_HEADER: csrf})
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    assert "admin" in resp.json()["detail"]
    assert client.get("/").status_code == 200  # but reads


def test_every_answer_has_the_content_security_policy(client: TestClient) -> None:
    answers = [
        client.get("/login"),
        client.get("/static/console.js"),
        client.get("/api/jobs"),
        client.get("/", follow_redirects=False),
        client.get("/healthz"),
    ]
    login(client, ANALYST)
    answers += [client.get("/"), client.get("/api/jobs")]
    for resp in answers:
        assert resp.headers["content-security-policy"] == CSP
        assert resp.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert "<script src='/static/console.js'" in answers[-2].text
    assert "<script>" not in answers[-2].text  # no inline script for the policy to allow


def test_bad_queries_get_a_clear_4xx(client: TestClient) -> None:
    csrf = login(client, ANALYST)
    h = {CSRF_HEADER: csrf}
    cases = [
        (b"not json", 400, "bad_json"),
        (b"[1]", 400, "bad_request"),
        (b'{"job": "j"}', 400, "bad_request"),
        (b'{"workload": "shapley", "job": "j", "round": 0}', 400, "bad_request"),
        (b'{"workload": "shapley", "job": "j", "params": [1]}', 400, "bad_request"),
        (b"x" * (MAX_QUERY_BODY + 1), 413, "body_too_large"),
    ]
    for body, status, error in cases:
        resp = client.post("/api/queries", content=body, headers=h)
        assert resp.status_code == status and resp.json()["error"] == error, (body[:40], resp.text)
        assert resp.json()["detail"]


def test_an_oversized_login_is_refused_before_it_is_read(client: TestClient) -> None:
    resp = client.post("/login", content=b"token=" + b"x" * MAX_LOGIN_BODY)
    assert resp.status_code == 413 and resp.json()["error"] == "body_too_large"


def test_no_docs_or_schema(client: TestClient) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404


def test_the_data_plane_is_the_admins(client: TestClient) -> None:
    login(client, ANALYST)
    assert "/dataplane" not in client.get("/").text  # no link for the analyst
    for path in ("/dataplane", "/api/dataplane"):
        resp = client.get(path, follow_redirects=False)
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", resp.text
    client.cookies.clear()
    login(client, ADMIN)
    assert "href='/dataplane'" in client.get("/").text
    page = client.get("/dataplane")
    assert page.status_code == 200 and "data-page='dataplane'" in page.text


def test_bad_revocations_get_a_clear_4xx(client: TestClient) -> None:
    csrf = login(client, ADMIN)
    h = {CSRF_HEADER: csrf}
    cases = [
        ("/api/jobs/j/clients/no%20such%20id!/revoke", "client"),
        ("/api/jobs/j/clients/" + "c" * 65 + "/revoke", "client"),
        ("/api/jobs/j/clients/c0/revoke?force=yes", "force"),
    ]
    for path, field in cases:
        resp = client.post(path, headers=h)
        assert resp.status_code == 400 and resp.json()["error"] == "bad_request", resp.text
        assert field in resp.json()["detail"]
    # good input gets past the console to the control plane, which is not there
    resp = client.post("/api/jobs/j/clients/c0/revoke?force=true", headers=h)
    assert resp.status_code == 502 and resp.json()["service"] == "control-plane", resp.text


def test_a_gateway_that_does_not_answer_is_an_error_on_the_data_plane(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    settings = ConsoleSettings(
        admin_token_file=write_token_file(tmp_path / "admin", ADMIN),
        analyst_token_file=write_token_file(tmp_path / "analyst", ANALYST),
        gateways=f"n1={dead}",
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        login(client, ADMIN)
        resp = client.get("/api/dataplane")
        assert resp.status_code == 200, resp.text
        (node,) = resp.json()["nodes"]
        assert node == {"url": dead, "node": "n1", "metrics": None, "router": None, "endpoints": []}
        errors = resp.json()["errors"]
        assert {(e["node"], e["service"]) for e in errors} == {("n1", "gateway")}
        assert len(errors) == 2  # its /metrics and its /v1/router

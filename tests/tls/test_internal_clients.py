"""The platform's own calls over mTLS: a runtime that requires client certificates (a real
``python -m runtime``) answers the cache engine's provider client (core.openfaas, as the
engine's lifespan builds it from its TLS settings) and the request tracker's calls, which
verify it against the platform's CA and present their certificates; without them, nothing."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.stack import start_gateway
from cache_engine.service import create_app as engine_app
from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from core.auth import Scope, bearer
from core.openfaas import OpenFaaS, OpenFaaSError
from core.services import free_port
from core.tls import client_context
from request_tracker.http import Calls, HttpError
from request_tracker.settings import TrackerSettings
from request_tracker.tracker import Tracker
from runtime.auth import BasicAuth
from runtime.settings import RuntimeSettings
from tests.auth.test_routes_need_credentials import _tokens
from tests.dataplane.gwproc import gateway_settings
from tests.polling import wait_until
from tests.tls.certs import Certs, mint, running, settings_of
from tests.tls.test_services_tls import _engine

pytestmark = pytest.mark.integration


@pytest.fixture()
def mtls_runtime(tmp_path: Path) -> Iterator[tuple[str, tuple[str, str], Certs]]:
    """``(https URL, basic auth, certificates)`` of a runtime that requires client certs."""
    certs = mint(tmp_path / "pki")
    auth = BasicAuth.ensure_dir(tmp_path / "auth")
    s = RuntimeSettings(
        port=free_port(),
        state_dir=tmp_path / "rt",
        auth_dir=tmp_path / "auth",
        **settings_of(certs.server, tls_client_certs="required"),
    )
    with running(s.to_argv(), s.host, s.port, tmp_path / "runtime.log"):
        yield f"https://{s.host}:{s.port}", (auth.user, auth.password), certs


def test_the_engine_s_provider_client_speaks_mtls_to_the_runtime(
    mtls_runtime: tuple[str, tuple[str, str], Certs],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url, auth, certs = mtls_runtime
    with pytest.raises(OpenFaaSError):  # no CA, no certificate: refused
        OpenFaaS(url, auth).list_functions()
    tokens = _tokens(tmp_path)
    built = _engine(tokens, request, settings_of(certs.client))
    settings = built.model_copy(update={"runtime_url": url, "runtime_auth_dir": tmp_path / "auth"})
    app = engine_app(cast(EngineSettings, settings))
    with TestClient(app):  # the lifespan builds the engine and its provider client
        engine = app.state.engine
        assert engine.openfaas.list_functions() == []


def test_the_tracker_s_calls_speak_mtls_to_the_runtime(
    mtls_runtime: tuple[str, tuple[str, str], Certs], tmp_path: Path
) -> None:
    url, _, certs = mtls_runtime
    tokens = _tokens(tmp_path)
    tracker = Tracker(
        TrackerSettings(function_token_file=tokens[Scope.SERVICE], **settings_of(certs.client)),
        None,
    )

    async def health(calls: Calls) -> int:
        calls.open()
        try:
            return (await calls("GET", url + "/healthz", None, {}, 10)).status_code
        finally:
            await calls.close()

    assert asyncio.run(health(tracker.http)) == 200
    with pytest.raises(HttpError):  # no certificate of the platform: refused
        asyncio.run(health(Calls()))


def _nodes(url: str, certs: Certs, analyst: Path) -> dict[str, Any]:
    r = httpx.get(
        url + "/v1/nodes",
        headers=bearer(analyst.read_text().strip()),
        verify=client_context(certs.ca.cert),
    )
    return {n["name"]: n for n in r.json()["nodes"]}


def test_the_control_plane_speaks_mtls_to_a_gateway_that_requires_it(
    tmp_path: Path, redis_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two control planes watch one gateway that requires client certificates: the one with the
    platform's certificate finds it healthy; the one without (it trusts the CA, through
    ``SSL_CERT_FILE``, but has no certificate to present) is refused at every health check."""
    certs = mint(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca.cert))  # the second plane's trust
    gw_settings = gateway_settings(
        tmp_path, redis_url, **settings_of(certs.server, tls_client_certs="required")
    )
    gw = start_gateway(gw_settings, tmp_path / "gateway.log")
    try:
        tokens = _tokens(tmp_path)
        planes = {
            name: ControlPlaneSettings(
                port=free_port(),
                gateways=f"n1={gw.url}",
                admin_token_file=tokens[Scope.ADMIN],
                analyst_token_file=tokens[Scope.ANALYST],
                **tls,
            )
            for name, tls in (("with", settings_of(certs.client)), ("without", {}))
        }
        with (
            running(planes["with"].to_argv(), "127.0.0.1", planes["with"].port, tmp_path / "a"),
            running(
                planes["without"].to_argv(), "127.0.0.1", planes["without"].port, tmp_path / "b"
            ),
        ):
            urls = {k: f"{s.scheme}://127.0.0.1:{s.port}" for k, s in planes.items()}
            analyst = tokens[Scope.ANALYST]
            wait_until(lambda: _nodes(urls["without"], certs, analyst)["n1"]["failures"] > 2, 30)
            n1 = _nodes(urls["with"], certs, analyst)["n1"]
            assert n1["healthy"] and n1["failures"] == 0, n1
    finally:
        gw.stop()
        shutil.rmtree(gw_settings.shm_root, ignore_errors=True)

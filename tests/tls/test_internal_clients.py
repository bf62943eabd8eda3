"""The platform's own calls over mTLS: a runtime that requires client certificates (a real
``python -m runtime``) answers the cache engine's provider client (core.openfaas, as the
engine's lifespan builds it from its TLS settings) and the request tracker's calls, which
verify it against the platform's CA and present their certificates; without them, nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from fastapi.testclient import TestClient

from cache_engine.service import create_app as engine_app
from cache_engine.settings import EngineSettings
from core.auth import Scope
from core.openfaas import OpenFaaS, OpenFaaSError
from core.services import free_port
from request_tracker.http import Calls, HttpError
from request_tracker.settings import TrackerSettings
from request_tracker.tracker import Tracker
from runtime.auth import BasicAuth
from runtime.settings import RuntimeSettings
from tests.auth.test_routes_need_credentials import _tokens
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

"""The credential walk of the runtime and its functions (tests/auth) over TLS: the very tests,
collected here against a runtime that serves HTTPS and starts the real ``aggregator`` and
``flstore`` replicas on HTTPS (its ``function_tls_*`` settings, as ``fedfaas up --tls`` does),
so every ``/function/*`` case crosses the runtime's mTLS hop to a replica. The clients verify
the runtime against the platform's CA and present no certificate (the SDK's kind)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.tls import TlsFiles, client_context, mint_cert
from runtime import RuntimeProcess
from tests.auth.test_runtime_and_function_routes import (
    runtime,
    test_every_function_route_needs_the_function_token,
    test_every_system_route_refuses_missing_and_wrong_credentials,
    test_right_token_reaches_the_handlers,
    test_the_health_check_is_open,
    test_the_watchdog_health_path_stays_open,
)
from tests.tls.certs import Certs, assert_plain_http_refused, mint, settings_of

pytestmark = pytest.mark.integration

#: the tests of tests/auth that run here again over TLS, with the fixture they need
OVER_TLS = [
    runtime,
    test_every_system_route_refuses_missing_and_wrong_credentials,
    test_the_health_check_is_open,
    test_every_function_route_needs_the_function_token,
    test_the_watchdog_health_path_stays_open,
    test_right_token_reaches_the_handlers,
]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Certs, TlsFiles]:
    """The platform's certificates, and the replicas' (``functions``)."""
    folder = tmp_path_factory.mktemp("pki")
    c = mint(folder)
    return c, mint_cert(c.ca, folder / "certs", "functions", ["127.0.0.1"])


@pytest.fixture(scope="module")
def runtime_extra(certs: tuple[Certs, TlsFiles]) -> Iterator[dict[str, Any]]:
    """The runtime serves HTTPS, its replicas too."""
    c, functions = certs
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SSL_CERT_FILE", str(c.ca.cert))  # RuntimeProcess's readiness probe
        yield settings_of(
            c.server, function_tls_cert_file=functions.cert, function_tls_key_file=functions.key
        )


@pytest.fixture(scope="module")
def verify(certs: tuple[Certs, TlsFiles]) -> Any:
    return client_context(certs[0].ca.cert)


def test_the_walk_ran_against_https_replicas(
    runtime: RuntimeProcess, certs: tuple[Certs, TlsFiles]
) -> None:
    c, _ = certs
    assert runtime.url.startswith("https://")
    with httpx.Client(
        base_url=runtime.url, auth=runtime.auth, verify=client_context(c.ca.cert)
    ) as h:
        replicas = [
            r
            for fn in ("aggregator", "flstore-cache-0")
            for r in h.get(f"/system/replicas/{fn}").json()
        ]
    assert len(replicas) == 2, replicas
    for r in replicas:
        assert_plain_http_refused(f"https://127.0.0.1:{r['port']}", "/_/health")

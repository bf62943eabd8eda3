"""The platform's calls from inside a function replica over TLS (``fedfaas up --tls``): a cache
function's evaluator client verifies the runtime against the CA that ``FEDFAAS_TLS_CA_FILE``
names (:func:`core.tls.platform_verify`), with no ``SSL_CERT_FILE`` in its environment, and
refuses a server that CA did not sign. The server here is an HTTPS endpoint in this process
answering what an evaluator function answers (the client's verification is under test; the
whole path runs on ``fedfaas up --tls`` in ``test_platform_tls.py``)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cache_engine.evaluators import GATEWAY_ENV, EvaluatorUnavailable, build_evaluator
from core.tls import CA_FILE_ENV, TlsError, platform_verify
from runtime.function_auth import SECRETS_DIR_ENV, TOKEN_SECRET
from tests.tls.certs import Certs, JsonHandler, https_server, mint

TOKEN = "function-token-for-the-test"
LAYOUT = (("bias", (2,)),)


class _Evaluator(JsonHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        self.reply(
            200 if ok else 401, {"utility": 0.25, "metrics": {"accuracy": 0.25}} if ok else {}
        )


@pytest.fixture()
def certs(tmp_path: Path) -> Certs:
    return mint(tmp_path / "pki")


@pytest.fixture()
def gateway(certs: Certs) -> Iterator[str]:
    """A runtime's https address (a certificate the platform's CA signed)."""
    with https_server(certs.server, _Evaluator) as url:
        yield url


@pytest.fixture()
def replica_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gateway: str) -> None:
    """A cache function replica's environment on a TLS platform, without SSL_CERT_FILE."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / TOKEN_SECRET).write_text(TOKEN)
    monkeypatch.setenv(SECRETS_DIR_ENV, str(secrets))
    monkeypatch.setenv(GATEWAY_ENV, gateway)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv(CA_FILE_ENV, raising=False)


def test_platform_verify_trusts_the_named_ca_else_the_system(certs: Certs, tmp_path: Path) -> None:
    assert platform_verify({}) is True
    ctx = platform_verify({CA_FILE_ENV: str(certs.ca.cert)})
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in ctx.get_ca_certs()] == [
        ((("commonName", "FedFaaS platform CA"),),)
    ]
    with pytest.raises(TlsError, match="not a file"):
        platform_verify({CA_FILE_ENV: str(tmp_path / "missing.crt")})


@pytest.mark.usefixtures("replica_env")
def test_the_evaluator_client_verifies_the_runtime_against_the_platform_ca(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CA_FILE_ENV, str(certs.ca.cert))
    ev = build_evaluator({"kind": "function", "function": "ev-platform-ca"}, LAYOUT)
    assert ev.metrics(np.zeros(2, np.float32)) == {"accuracy": 0.25, "utility": 0.25}


@pytest.mark.usefixtures("replica_env")
def test_without_the_platform_ca_the_evaluator_client_refuses_the_runtime() -> None:
    """The system's CAs do not know the platform's: the call fails verification, clearly."""
    ev = build_evaluator({"kind": "function", "function": "ev-system-cas"}, LAYOUT)
    with pytest.raises(EvaluatorUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        ev.metrics(np.zeros(2, np.float32))


@pytest.mark.usefixtures("replica_env")
def test_a_ca_variable_naming_no_file_is_a_clear_evaluator_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CA_FILE_ENV, str(tmp_path / "no-ca.crt"))
    with pytest.raises(EvaluatorUnavailable, match="cannot verify the gateway"):
        build_evaluator({"kind": "function", "function": "ev-missing-ca"}, LAYOUT)


def test_a_server_another_ca_signed_is_refused(certs: Certs) -> None:
    """The platform's CA alone is trusted: a server with another CA's certificate is not."""
    import httpx

    with https_server(certs.stranger, _Evaluator) as url:
        verify = platform_verify({CA_FILE_ENV: str(certs.ca.cert)})
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.post(url, content=b"x", verify=verify)

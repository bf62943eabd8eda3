"""The runtime's replicas over TLS (its ``function_tls_*`` settings, ``fedfaas up --tls``): a real
``python -m runtime`` serving HTTPS starts ``echo``'s replica on HTTPS, reaches it over mTLS
(its proxy and its health probe), and the replica takes only clients with a certificate the
platform's CA signed: not plain HTTP (a clear 400), not a client without a certificate, not one of another
CA. A function's own calls (:func:`core.tls.platform_verify`) present the replica's
certificate. Settings that cannot work stop the runtime with exit 2 saying why."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS
from core.tls import CA_FILE_ENV, CERT_FILE_ENV, KEY_FILE_ENV, TlsFiles, mint_cert, platform_verify
from runtime import RuntimeProcess
from runtime.settings import RuntimeSettings
from tests.polling import wait_until
from tests.runtime.conftest import FN_AUTH, STACK, available, client, echo_body
from tests.tls.certs import Certs, assert_plain_http_refused, mint, settings_of
from tests.tls.test_gateway_tls import _tls_get

pytestmark = pytest.mark.integration


@dataclass
class TlsRuntime:
    rt: RuntimeProcess
    certs: Certs
    functions: TlsFiles  #: the replicas' certificate (``fedfaas up --tls``: ``functions``)
    replica: dict[str, object]  #: echo's replica, as ``/system/replicas/echo`` says

    @property
    def replica_url(self) -> str:
        return f"https://127.0.0.1:{self.replica['port']}"


@pytest.fixture(scope="module")
def tls_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRuntime]:
    tmp_path = tmp_path_factory.mktemp("function-tls")
    certs = mint(tmp_path / "pki")
    functions = mint_cert(certs.ca, tmp_path / "pki" / "certs", "functions", ["127.0.0.1"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSL_CERT_FILE", str(certs.ca.cert))  # RuntimeProcess's own probes
        yield from _runtime_with_echo(tmp_path, certs, functions)


def _runtime_with_echo(tmp_path: Path, certs: Certs, functions: TlsFiles) -> Iterator[TlsRuntime]:
    settings = settings_of(
        certs.server,
        function_tls_cert_file=functions.cert,
        function_tls_key_file=functions.key,
    )
    rt = RuntimeProcess(stack=STACK, state_dir=tmp_path / "rt", settings=settings).start()
    try:
        assert rt.url.startswith("https://")
        with OpenFaaS(rt.url, rt.auth, verify=certs.client.client_context()) as gw:
            gw.set_secret(FUNCTION_TOKEN_SECRET, FN_AUTH["Authorization"].split()[1])
        with client(rt, timeout=60, verify=certs.client.client_context()) as http:
            assert http.post("/system/functions", json=echo_body("echo")).status_code == 202
            wait_until(lambda: available(http, "echo") >= 1, 60, "echo's replica ready")
            [replica] = http.get("/system/replicas/echo").json()
        yield TlsRuntime(rt, certs, functions, replica)
    finally:
        rt.stop()


def test_the_runtime_reaches_its_replica_over_mtls(tls_runtime: TlsRuntime) -> None:
    """An invocation through the runtime's proxy answers: the runtime verified the replica
    against the CA and presented its own certificate, which the replica requires."""
    t = tls_runtime
    with client(t.rt, timeout=60, verify=t.certs.client.client_context()) as http:
        r = http.post("/function/echo", content=b"over mtls")
    assert r.status_code == 200 and b"over mtls" in r.content, r.text
    env = Path(f"/proc/{t.replica['pid']}/environ").read_bytes().split(b"\0")
    assert f"FEDFAAS_REPLICA_URL={t.replica_url}".encode() in env
    assert f"{CERT_FILE_ENV}={t.functions.cert}".encode() in env
    assert f"{CA_FILE_ENV}={t.certs.ca.cert}".encode() in env


def test_the_replica_takes_only_clients_with_a_certificate_of_the_platform_ca(
    tls_runtime: TlsRuntime,
) -> None:
    t = tls_runtime
    port = int(str(t.replica["port"]))
    assert_plain_http_refused(t.replica_url, "/_/health")
    no_cert = ssl.create_default_context(cafile=str(t.certs.ca.cert))  # the SDK's kind
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(port, no_cert)
    stranger = TlsFiles(t.certs.stranger.cert, t.certs.stranger.key, t.certs.ca.cert)
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(port, stranger.client_context())
    # a part of the platform (the request tracker calling /run directly): let in, and the
    # function token still required behind the handshake
    with httpx.Client(verify=t.certs.client.client_context(), timeout=30) as part:
        assert part.post(t.replica_url, content=b"x").status_code == 401
        r = part.post(t.replica_url, content=b"direct", headers=FN_AUTH)
    assert r.status_code == 200 and b"direct" in r.content


def test_a_function_s_own_calls_present_the_replica_certificate(tls_runtime: TlsRuntime) -> None:
    """What a cache function calls another replica with (functions/flstore/remote.py): the
    CA alone is refused by a replica; with the replica's certificate in the environment, in."""
    t = tls_runtime
    env = {CA_FILE_ENV: str(t.certs.ca.cert)}
    ca_only = platform_verify(env)
    assert isinstance(ca_only, ssl.SSLContext)
    port = int(str(t.replica["port"]))
    with pytest.raises((OSError, httpx.TransportError)):
        _tls_get(port, ca_only)
    env.update({CERT_FILE_ENV: str(t.functions.cert), KEY_FILE_ENV: str(t.functions.key)})
    with httpx.Client(verify=platform_verify(env), timeout=30) as fn:
        r = fn.post(t.replica_url, content=b"from a function", headers=FN_AUTH)
    assert r.status_code == 200 and b"from a function" in r.content


def _runtime_exit(tmp_path: Path, **settings: Any) -> subprocess.CompletedProcess[str]:
    auth = tmp_path / "auth"
    auth.mkdir(exist_ok=True)
    (auth / "basic-auth-user").write_text("admin")
    (auth / "basic-auth-password").write_text("pw")
    argv = RuntimeSettings(
        port=0, state_dir=tmp_path / "rt", auth_dir=auth, stack=STACK, **settings
    ).to_argv()
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_function_tls_that_cannot_work_stops_the_runtime_with_exit_2(tmp_path: Path) -> None:
    certs = mint(tmp_path / "pki")
    fn = {"function_tls_cert_file": certs.client.cert, "function_tls_key_file": certs.client.key}
    # no certificate of the runtime's own to present to its replicas
    done = _runtime_exit(tmp_path, tls_ca_file=certs.ca.cert, **fn)
    assert done.returncode == 2 and "function TLS needs the runtime's own" in done.stderr
    # of-watchdog serves plain HTTP only
    done = _runtime_exit(tmp_path, watchdog=Path(sys.executable), **settings_of(certs.server), **fn)
    assert done.returncode == 2 and "of-watchdog" in done.stderr, done.stderr
    # the replicas' key readable by others
    certs.client.key.chmod(0o644)
    done = _runtime_exit(tmp_path, **settings_of(certs.server), **fn)
    assert done.returncode == 2 and "readable by others" in done.stderr, done.stderr


def test_a_tls_replica_stops_at_its_sigterm_while_the_runtime_holds_connections_to_it(
    tls_runtime: TlsRuntime,
) -> None:
    """A removed function's replica ends at the runtime's SIGTERM, within its grace: its
    TLS connections that the runtime's clients keep idle in their pools, which never answer
    the replica's close_notify, are aborted after a short wait (asyncio's 30 s held the
    replica until the runtime's SIGKILL, ``did not stop in 10.0s``)."""
    t = tls_runtime
    with client(t.rt, timeout=60, verify=t.certs.client.client_context()) as http:
        assert http.post("/system/functions", json=echo_body("echo2")).status_code == 202
        wait_until(lambda: available(http, "echo2") >= 1, 60, "echo2's replica ready")
        assert http.post("/function/echo2", content=b"kept alive").status_code == 200
        r = http.request("DELETE", "/system/functions", json={"functionName": "echo2"})
        assert r.status_code == 202, r.text
    stopped = wait_until(
        lambda: [
            ln
            for ln in t.rt.log_path.read_text().splitlines()
            if "echo2-0" in ln and ("stopped" in ln or "did not stop" in ln)
        ],
        60,
        "the runtime's log of echo2-0's stop",
    )
    assert "did not stop" not in stopped[0], stopped

"""A platform CA with a part's certificates, and a second CA with a client of its own, minted
by :mod:`core.tls` into a test's folder; the settings that serve them; a service run for a
block."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.services import wait_for_port
from core.tls import TlsFiles, mint_ca, mint_cert


@dataclass(frozen=True)
class Certs:
    ca: TlsFiles  #: the platform's CA
    server: TlsFiles  #: the part under test (127.0.0.1, localhost)
    client: TlsFiles  #: another part of the platform (a client certificate the CA signed)
    stranger: TlsFiles  #: a client certificate from another CA


def mint(folder: Path) -> Certs:
    ca = mint_ca(folder / "ca")
    other = mint_ca(folder / "other-ca", name="another CA")
    hosts = ["127.0.0.1", "localhost"]
    return Certs(
        ca=ca,
        server=mint_cert(ca, folder / "certs", "server", hosts),
        client=mint_cert(ca, folder / "certs", "peer", hosts),
        stranger=mint_cert(other, folder / "other-ca", "stranger", hosts),
    )


@pytest.fixture()
def certs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Certs:
    """The platform's certificates (:func:`mint`); this process's httpx trusts the platform's
    CA only and presents no certificate (as a user of the SDK). A fixture: import it by name."""
    c = mint(tmp_path / "pki")
    monkeypatch.setenv("SSL_CERT_FILE", str(c.ca.cert))
    return c


def settings_of(part: TlsFiles, **more: Any) -> dict[str, Any]:
    """The ``tls_*`` settings of a component serving (and calling) with ``part``'s files."""
    return {
        "tls_cert_file": part.cert,
        "tls_key_file": part.key,
        "tls_ca_file": part.ca,
        **more,
    }


@contextmanager
def running(argv: list[str], host: str, port: int, log_path: Path) -> Iterator[None]:
    """Run ``argv`` (a service listening on ``host:port``) for the block; SIGTERM after it."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(host, port, 60, proc)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def assert_plain_http_refused(https_url: str, path: str = "/healthz") -> None:
    """Plain HTTP to ``https_url``'s port, a GET and a POST with a body, is answered a 400
    ``tls_required`` JSON naming the https address to use (:func:`core.tls_front.plain_http_answer`),
    the body never read."""
    import httpx

    plain = https_url.replace("https://", "http://", 1)
    for r in (
        httpx.get(plain + path, timeout=30),
        httpx.post(plain + path, content=b"x" * 65536, timeout=30),
    ):
        assert r.status_code == 400, (r.status_code, r.text)
        assert r.json()["error"] == "tls_required", r.text
        assert f"{https_url}/" in r.json()["detail"], r.text

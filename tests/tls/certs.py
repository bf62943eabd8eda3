"""A platform CA with a part's certificates, and a second CA with a client of its own, minted
by :mod:`core.tls` into a test's folder; the settings that serve them; a service run for a
block; an HTTPS server in this process for a block."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class JsonHandler(BaseHTTPRequestHandler):
    """An ``http.server`` handler with :meth:`reply`, logging nothing."""

    def reply(self, status: int, doc: Any) -> None:
        """Answer ``status`` with ``doc`` as JSON."""
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def https_server(files: TlsFiles, handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` serving HTTPS on 127.0.0.1 from ``files`` (:meth:`TlsFiles.server_context`)
    in a thread of this process, for the block; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = files.server_context().wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


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

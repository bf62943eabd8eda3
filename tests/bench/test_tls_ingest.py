"""bench-tls_ingest's ceiling (issue 41): the TLS record layer alone, as the result states it,
opens every byte of an upload sealed by a client (a record layer that lost or garbled bytes
would not be a ceiling), and measures what it says on the negotiated suite."""

from __future__ import annotations

import os
from pathlib import Path

from bench.tls_ingest import _record_layer
from core.tls import TlsFiles, client_context, mint_ca, mint_cert


def test_the_record_layer_opens_a_whole_upload(tmp_path: Path) -> None:
    ca = mint_ca(tmp_path)
    cert = mint_cert(ca, tmp_path, "gateway", ["127.0.0.1"])
    server = TlsFiles(cert.cert, cert.key, None).server_context()
    body = os.urandom(3 * 1024 * 1024 + 12345)  # records across many 256 KiB pieces, a tail
    got = _record_layer(body, server, client_context(ca.cert), reps=2)
    assert got is not None and got["n"] == 2
    assert 0 < got["min"] <= got["median"] <= got["max"]

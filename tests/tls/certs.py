"""A platform CA with a gateway's certificate, and a second CA with a client of its own, minted
by :mod:`core.tls` into a test's folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

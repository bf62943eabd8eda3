"""TLS for the platform's HTTP servers and their clients (issue 41).

A part that serves TLS has three files (secrets are files, mode 0600 for the key): its
certificate, its key, and the CA that signed the platform's certificates. :class:`TlsFiles`
turns them into an :class:`ssl.SSLContext`:

- :meth:`TlsFiles.server_context`: TLS 1.2 or newer, the part's certificate; with a CA, a
  client that presents a certificate must present one the CA signed (the handshake fails
  otherwise); ``client_certs="required"`` also refuses a client that presents none (mTLS).
- :meth:`TlsFiles.client_context`: verifies the server's certificate against the CA and its
  name (the host of the URL), and presents the part's own certificate (mTLS).

:func:`mint_ca` and :func:`mint_cert` make a local CA and per-part certificates (EC P-256,
written 0600) with the ``cryptography`` library, for a platform that has no PKI of its own and
for the tests.

The SDK verifies the platform's servers against its CA file (``ca_file``, :mod:`client.tls`).
Code that runs in a function replica and calls the platform back (an FLStore cache function
calling a job's evaluator function through the runtime, or another cache function's replica)
verifies with :func:`platform_verify`, the CA named by :data:`CA_FILE_ENV`, and presents the
replica's certificate where :data:`CERT_FILE_ENV` and :data:`KEY_FILE_ENV` name one. Those
variables, not ``SSL_CERT_FILE``, carry the platform's CA, so a function's calls to outside
https services keep the system's CAs. A runtime with function TLS (``fedfaas up --tls``) sets
all three in its replicas' environment, and the embedded watchdog serves HTTPS with them,
requiring a client certificate the CA signed (:func:`replica_files`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

ClientCerts = Literal["none", "optional", "required"]

#: the platform's CA certificate (a public file) for clients without certificates of their own
#: inside the platform, e.g. in function replicas (``fedfaas up --tls`` sets it)
CA_FILE_ENV = "FEDFAAS_TLS_CA_FILE"

#: a function replica's certificate and key (the runtime's ``--function-tls-*`` files): the
#: embedded watchdog serves HTTPS with them, and the function presents them to the platform
CERT_FILE_ENV = "FEDFAAS_TLS_CERT_FILE"
KEY_FILE_ENV = "FEDFAAS_TLS_KEY_FILE"


class TlsError(ValueError):
    """A TLS setting that cannot work (a missing file, a key others can read)."""


@dataclass(frozen=True)
class TlsFiles:
    """A part's certificate and key, the platform's CA, and what the server asks of clients."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_certs: ClientCerts = "optional"

    def check(self) -> TlsFiles:
        """Raise :class:`TlsError` when a file is missing or the key is readable by others."""
        for what, p in (("certificate", self.cert), ("key", self.key), ("CA", self.ca)):
            if p is not None and not p.is_file():
                raise TlsError(f"TLS {what} file {p} does not exist")
        if self.key.stat().st_mode & 0o077:
            raise TlsError(f"TLS key file {self.key} is readable by others (chmod 600 it)")
        if self.client_certs == "required" and self.ca is None:
            raise TlsError("client certificates are required but no CA file is set")
        return self

    def server_context(self) -> ssl.SSLContext:
        """The context a server wraps its connections in (see the module docstring)."""
        self.check()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.ca is not None and self.client_certs != "none":
            ctx.load_verify_locations(cafile=self.ca)
            ctx.verify_mode = (
                ssl.CERT_REQUIRED if self.client_certs == "required" else ssl.CERT_OPTIONAL
            )
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context this part's own clients use to call the other parts."""
        self.check()
        ctx = client_context(self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def client_context(ca: Path | None) -> ssl.SSLContext:
    """Verify servers against ``ca`` (the system's CAs when ``None``), TLS 1.2 or newer."""
    ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def platform_verify(environ: Mapping[str, str] | None = None) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for a call to the platform's own parts from a function replica: a
    context that trusts the CA :data:`CA_FILE_ENV` names (in ``environ``, by default the
    process's) and presents the replica's certificate where :data:`CERT_FILE_ENV` and
    :data:`KEY_FILE_ENV` name one (mTLS), else ``True`` (the system's CAs: a platform without
    TLS, or one whose parts have publicly trusted certificates)."""
    env = os.environ if environ is None else environ
    ca = env.get(CA_FILE_ENV, "")
    if not ca:
        return True
    if not Path(ca).is_file():
        raise TlsError(f"{CA_FILE_ENV} names {ca}, which is not a file")
    own = replica_files(env)
    return own.client_context() if own is not None else client_context(Path(ca))


def replica_files(environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """A function replica's TLS files from its environment (:data:`CERT_FILE_ENV`,
    :data:`KEY_FILE_ENV`, :data:`CA_FILE_ENV`), client certificates required: only the
    platform's parts call a replica. ``None`` (plain HTTP) without a certificate; a
    :class:`TlsError` when they cannot work (a file missing, no CA, a key others can read)."""
    env = os.environ if environ is None else environ
    cert, key, ca = (env.get(n, "") for n in (CERT_FILE_ENV, KEY_FILE_ENV, CA_FILE_ENV))
    return from_settings(
        Path(cert) if cert else None,
        Path(key) if key else None,
        Path(ca) if ca else None,
        "required",
    )


def from_settings(
    cert: Path | None, key: Path | None, ca: Path | None, client_certs: ClientCerts
) -> TlsFiles | None:
    """The :class:`TlsFiles` a component's settings name; ``None`` (plain HTTP) without a
    certificate. A certificate without its key (or the reverse) is a :class:`TlsError`."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise TlsError("TLS needs both a certificate file and a key file")
    return TlsFiles(cert, key, ca, client_certs).check()


class TlsSettings(BaseModel):
    """The TLS settings of a component (a mixin of its settings class): with
    ``tls_cert_file`` and ``tls_key_file`` its port speaks HTTPS only."""

    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_client_certs: ClientCerts = "optional"

    def tls(self) -> TlsFiles | None:
        """The files these settings name (``None``: plain HTTP); :class:`TlsError` when they
        cannot work."""
        return from_settings(
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_client_certs
        )

    @property
    def scheme(self) -> str:
        """``https`` with a certificate, else ``http``."""
        return "https" if self.tls_cert_file is not None else "http"


# -- minting -------------------------------------------------------------------------------------
def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_pair(directory: Path, name: str, key: Any, cert: Any) -> tuple[Path, Path]:
    """``<name>.crt`` and ``<name>.key`` (PEM, both 0600) in ``directory``."""
    from cryptography.hazmat.primitives import serialization

    crt_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    pkcs8 = serialization.PrivateFormat.PKCS8
    pem = serialization.Encoding.PEM
    _write_private(key_path, key.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    _write_private(crt_path, cert.public_bytes(pem))
    return crt_path, key_path


def mint_ca(directory: Path, name: str = "FedFaaS platform CA", days: int = 365) -> TlsFiles:
    """A self-signed CA in ``directory`` (``ca.crt``, ``ca.key``, both 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    crt_path, key_path = _write_pair(directory, "ca", key, cert)
    return TlsFiles(crt_path, key_path, crt_path)


def mint_cert(
    ca: TlsFiles, directory: Path, name: str, hosts: list[str], days: int = 365
) -> TlsFiles:
    """A certificate for part ``name``, valid for ``hosts`` (DNS names or IP addresses) as a
    server and as a client, signed by ``ca``: ``<name>.crt`` and ``<name>.key`` (0600) in
    ``directory``, with ``ca``'s certificate as the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    crt_path, key_path = _write_pair(directory, name, key, cert)
    return TlsFiles(crt_path, key_path, ca.cert)

"""The certificates of a test cluster: a CA, serving certificates (etcd, the API server), client
certificates (the API server towards etcd, the admin, the controller manager), the service
account signing key and the kubeconfigs that use them; all files in one folder of the test.

Made with ``cryptography`` (EC P-256 certificates, an RSA service-account key, as kubeadm
makes), valid for a day: a test cluster lives for minutes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=1)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class Pki:
    """A CA in ``folder`` that issues the cluster's certificates.

    Parameters
    ----------
    folder
        Where every file goes (created).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = _name("fedfaas-test-cluster-ca")
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = KeyPair(folder / "ca.crt", folder / "ca.key")
        self.ca.cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.ca.key, self._ca_key)

    def issue(
        self,
        name: str,
        cn: str,
        *,
        org: str | None = None,
        server: bool = False,
        client: bool = False,
        ips: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
    ) -> KeyPair:
        """A certificate ``name.crt`` (and ``name.key``) for ``cn`` (the user name a client
        certificate authenticates as) in group ``org``, for TLS serving (with the
        ``ips``/``dns`` names) and/or client authentication."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        sans += [x509.DNSName(d) for d in dns]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair

    def service_account_keys(self) -> KeyPair:
        """The key that signs service-account tokens (``sa.key``) and its public half
        (``sa.pub``, in :attr:`KeyPair.cert`)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pair = KeyPair(self.folder / "sa.pub", self.folder / "sa.key")
        _write_key(pair.key, key)
        pair.cert.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return pair

    def kubeconfig(
        self,
        name: str,
        server: str,
        *,
        client: KeyPair | None = None,
        token: str | None = None,
    ) -> Path:
        """A kubeconfig ``name.kubeconfig`` for ``server`` that trusts this CA and
        authenticates with the ``client`` certificate or a bearer ``token`` (its value is
        written into the file, which is mode 0600, as kubeconfigs are)."""
        user: dict[str, str] = {}
        if client is not None:
            user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
        if token is not None:
            user["token"] = token
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fedfaas-test",
                    "cluster": {"server": server, "certificate-authority": str(self.ca.cert)},
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [
                {"name": name, "context": {"cluster": "fedfaas-test", "user": name}},
            ],
            "current-context": name,
        }
        path = self.folder / f"{name}.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

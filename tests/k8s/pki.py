"""The certificates of a test cluster: a CA, serving certificates (etcd, the API server), client
certificates (the API server towards etcd, the admin, the controller manager), the service
account signing key and the kubeconfigs that use them; all files in one folder of the test.

Made with the ``openssl`` command (Debian's; ca-certificates depends on it): EC P-256
certificates and an RSA service-account key, as kubeadm makes them, valid for a day (a test
cluster lives for minutes).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

_DAYS = "1"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {res.stderr.strip()}")


def _subject(cn: str, org: str | None) -> str:
    return f"/CN={cn}" + (f"/O={org}" if org else "")


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
        folder.chmod(0o700)
        self.ca = KeyPair(folder / "ca.crt", folder / "ca.key")
        _openssl(
            "req", "-x509", *_EC, "-days", _DAYS,
            "-subj", _subject("fedfaas-test-cluster-ca", None),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
            "-keyout", str(self.ca.key), "-out", str(self.ca.cert),
            cwd=folder,
        )  # fmt: skip

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
        pair = KeyPair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        csr, ext = self.folder / f"{name}.csr", self.folder / f"{name}.ext"
        usages = ["serverAuth"] * server + ["clientAuth"] * client
        lines = ["basicConstraints=critical,CA:FALSE", f"extendedKeyUsage={','.join(usages)}"]
        sans = [f"IP:{i}" for i in ips] + [f"DNS:{d}" for d in dns]
        if sans:
            lines.append(f"subjectAltName={','.join(sans)}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-new", *_EC, "-subj", _subject(cn, org),
            "-keyout", str(pair.key), "-out", str(csr),
            cwd=self.folder,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-days", _DAYS,
            "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key), "-CAcreateserial",
            "-extfile", str(ext), "-out", str(pair.cert),
            cwd=self.folder,
        )  # fmt: skip
        return pair

    def service_account_keys(self) -> KeyPair:
        """The key that signs service-account tokens (``sa.key``) and its public half
        (``sa.pub``, in :attr:`KeyPair.cert`)."""
        pair = KeyPair(self.folder / "sa.pub", self.folder / "sa.key")
        _openssl(
            "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
            "-out", str(pair.key),
            cwd=self.folder,
        )  # fmt: skip
        _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert), cwd=self.folder)
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

"""The chart's TLS from Secrets on a test node (values ``tls``, charts/fedfaas/templates/_helpers.tpl):
a CA and a certificate for each TLS part minted with openssl (:class:`tests.k8s.pki.Pki`), the
Secrets ``<prefix>-<part>`` (``tls.crt``, ``tls.key``, ``ca.crt``) the chart's pods mount, made
before ``helm install`` as an operator makes them, and the values that turn TLS on.

Each part's certificate names the DNS names of the Service it is reached by. The node gateways'
also names every node they serve and no address: the control plane and the gateways reach a
gateway at ``https://POD_IP:PORT``, found through the headless Service, keep it only when its
certificate names the node it claims and verify every later call against that node's name
(core/server_names.py), as the SDK does with the ``tls_name`` the control plane gives.
"""

from __future__ import annotations

import base64
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.k8s.api import KubeApi
from tests.k8s.pki import KeyPair, Pki

#: the prefix of the parts' Secrets (values ``tls.secretName``)
SECRET_PREFIX = "fedfaas-test-tls"
#: the chart's TLS parts, by the name of their Service after the release's full name
PARTS = ("node-gateway", "control-plane", "cache-engine", "request-tracker")


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names a Service is reached by inside the cluster."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


@dataclass(frozen=True)
class ChartPki:
    """The CA, each part's certificate, a client certificate of the CA (``operator``, an
    operator's ``curl --cert``) and one of another CA (``stranger``)."""

    ca: Path
    parts: dict[str, KeyPair]
    operator: KeyPair
    stranger: KeyPair

    def verify(self, client: KeyPair | None = None) -> ssl.SSLContext:
        """A client context trusting the CA, presenting ``client`` where given."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if client is not None:
            ctx.load_cert_chain(str(client.cert), str(client.key))
        return ctx


def mint(folder: Path, release: str, namespace: str, nodes: list[str]) -> ChartPki:
    """The certificates of a release in ``namespace`` whose gateways serve ``nodes``."""
    pki = Pki(folder / "ca")
    parts = {}
    for part in PARTS:
        dns = service_names(f"{release}-{part}", namespace)
        if part == "node-gateway":
            dns += service_names(f"{release}-node-gateway-peers", namespace) + tuple(nodes)
        parts[part] = pki.issue(part, part, server=True, client=True, dns=dns)
    operator = pki.issue("operator", "operator", client=True)
    stranger = Pki(folder / "other-ca").issue("stranger", "stranger", client=True)
    return ChartPki(pki.ca.cert, parts, operator, stranger)


def create_secrets(api: KubeApi, pki: ChartPki, namespace: str) -> None:
    """The Secret of each part, as the chart's values ``tls.secretName`` expect them."""
    ca = pki.ca.read_bytes()
    for part, pair in pki.parts.items():
        data = {"tls.crt": pair.cert.read_bytes(), "tls.key": pair.key.read_bytes(), "ca.crt": ca}
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": f"{SECRET_PREFIX}-{part}", "namespace": namespace},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            }
        )


#: ``--set`` arguments of a release with TLS from the Secrets :func:`create_secrets` makes
VALUES = ["--set", "tls.enabled=true", "--set", f"tls.secretName={SECRET_PREFIX}"]


@contextmanager
def resolving(names: dict[str, str]) -> Iterator[None]:
    """This process's name lookups answer ``names`` (name -> address) as a hosts file would,
    for a client outside the cluster (the node's network namespace, whose resolver is the
    host's) calling a Service by the DNS name its certificate names."""
    real = socket.getaddrinfo

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real(names.get(host, host), *args, **kwargs)

    socket.getaddrinfo = lookup
    try:
        yield
    finally:
        socket.getaddrinfo = real

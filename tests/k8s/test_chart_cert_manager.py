"""FedFaaS's chart on a real node with its certificates issued by cert-manager (issue 41: "the
chart mounts certificates from Secrets, or from cert-manager when present").

cert-manager's controller (:mod:`tests.k8s.cert_manager`: cert-manager's own control loops,
built from the Go module proxy by scripts/cert-manager-controller.sh) runs in the node's
namespace against its API server, with cert-manager's CRDs, holding its leader-election Lease.
An Issuer of kind CA signs with a CA the test mints (its Secret made first); then ``helm install
--wait`` with ``tls.enabled=true`` and ``tls.certManager.issuerRef.name`` set: the chart makes
one Certificate per TLS part, the controller issues each (a CertificateRequest, approved and
signed by the CA Issuer) into the Secret the part's pods mount, and kubelet starts the pods once
the Secrets exist. Then:

- every Certificate is Ready and its Secret, written and annotated by cert-manager, holds
  ``tls.crt`` (signed by the CA, naming the Certificate's DNS names), ``tls.key`` and ``ca.crt``
  (the CA);
- every pod of the release is Ready, and each TLS part serves the very certificate of its
  Secret (a handshake with its Service);
- a job through the SDK over HTTPS (``ca_file``: the CA alone) is the float64 FedAvg of the
  updates.

Not shown here: the webhook and the cainjector (not run), renewal (the certificates live
``tls.certManager.duration``, 90 days by default), any Issuer kind but CA.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from core.services import find_binary
from tests.k8s import cert_manager
from tests.k8s.chart_release import (
    IMAGES,
    NAMESPACE,
    RELEASE,
    get,
    install,
    pods_report,
    secret,
)
from tests.k8s.chart_tls import PARTS, resolving
from tests.k8s.conftest import _missing
from tests.k8s.faas_netes import FUNCTION_NAMESPACE, install_openfaas_objects
from tests.k8s.node import Node, pod_ready
from tests.k8s.node_files import POD_CIDR
from tests.k8s.node_fixture import started_node
from tests.k8s.pki import KeyPair, Pki
from tests.k8s.sdk_job import NodeJob
from tests.openfaas.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]

ISSUER = "fedfaas-ca"
#: each TLS part's port (the cache engine requires a client certificate)
PORTS = {"node-gateway": 8081, "control-plane": 8070, "cache-engine": 8091, "request-tracker": 8092}


class Issued:
    """The node with the chart installed on cert-manager's certificates, the CA that signs
    them and a client certificate of that CA."""

    def __init__(self, node: Node, manager: cert_manager.CertManager, ca: Path, client: KeyPair):
        self.node, self.manager, self.ca, self.client = node, manager, ca, client

    def verify(self, client: bool = False) -> ssl.SSLContext:
        """A client context trusting the CA alone (presenting the client certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if client:
            ctx.load_cert_chain(str(self.client.cert), str(self.client.key))
        return ctx

    def service(self, part: str) -> tuple[str, str]:
        """A part's Service: its DNS name (in the certificate) and its ClusterIP."""
        name = f"{RELEASE}-{part}"
        svc = self.node.cluster.api.get("v1", "Service", name, NAMESPACE)
        assert svc is not None, name
        return f"{name}.{NAMESPACE}.svc", str(svc["spec"]["clusterIP"])


@pytest.fixture(scope="module")
def issued(
    k8s_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Issued]:
    """A node; cert-manager's CRDs and controller; a CA Issuer; the chart installed with
    ``tls.certManager.issuerRef.name`` (``helm install --wait``: every pod Ready)."""
    binary = cert_manager.controller_binary()
    if binary is None:
        _missing(f"cert-manager's controller {cert_manager.VERSION}: run `make k8s-binaries`")
        raise AssertionError("unreachable")
    folder = tmp_path_factory.mktemp("k8s-cert-manager")
    tools = () if find_binary("helm") else ("helm (`make helm`)",)
    ca = Pki(folder / "issuer-ca")
    client = ca.issue("operator", "operator", client=True)
    # the gateways' addresses too, for a release that verifies gateways by address
    addresses = [str(ip) for ip in ipaddress.ip_network(POD_CIDR).hosts()]
    values = folder / "values.yaml"
    values.write_text(yaml.safe_dump({"tls": {"nodeGateway": {"ipAddresses": addresses}}}))
    with started_node(k8s_binaries, folder, list(IMAGES.values()), tools) as node:
        install_openfaas_objects(node.cluster, folder / "basic-auth")
        cert_manager.install_crds(node.cluster.api)
        manager = cert_manager.CertManager.start(node.cluster, binary, folder)
        manager.ca_issuer(ISSUER, NAMESPACE, ca.ca)
        try:
            install(
                node, tmp_path_factory.mktemp("helm-home"),
                "--set", "tls.enabled=true", "--set", f"tls.certManager.issuerRef.name={ISSUER}",
                "-f", str(values),
            )  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ncert-manager's log:\n{manager.log()}") from None
        yield Issued(node, manager, ca.ca.cert, client)


def _certificates(issued: Issued) -> dict[str, dict[str, Any]]:
    api = issued.node.cluster.api
    return {
        c["metadata"]["name"]: c for c in api.list("cert-manager.io/v1", "Certificate", NAMESPACE)
    }


def _pem_certs(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


@pytest.mark.slow
@pytest.mark.integration
def test_every_certificate_is_issued_by_the_ca_issuer_into_its_secret(issued: Issued) -> None:
    certs = _certificates(issued)
    assert set(certs) == {f"{RELEASE}-tls-{p}" for p in PARTS}, set(certs)
    assert all(cert_manager.condition(c, "Ready") for c in certs.values()), certs
    ca = _pem_certs(issued.ca.read_text())[0]
    for name, cert in certs.items():
        spec = cert["spec"]
        assert (spec["secretName"], spec["issuerRef"]["name"]) == (name, ISSUER), spec
        obj = issued.node.cluster.api.get("v1", "Secret", name, NAMESPACE)
        assert obj is not None, name
        notes = obj["metadata"]["annotations"]  # written by cert-manager's issuing loop
        assert notes["cert-manager.io/certificate-name"] == name, notes
        assert notes["cert-manager.io/issuer-name"] == ISSUER, notes
        assert notes["cert-manager.io/issuer-kind"] == "Issuer", notes
        assert set(obj["data"]) >= {"tls.crt", "tls.key", "ca.crt"}, set(obj["data"])
        assert secret(issued.node, name, "ca.crt").strip() == issued.ca.read_text().strip()
        leaf = _pem_certs(secret(issued.node, name, "tls.crt"))[0]
        leaf.verify_directly_issued_by(ca)  # signed by the Issuer's CA, or it raises
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(spec["dnsNames"]), name
        requests = [
            r
            for r in issued.node.cluster.api.list(
                "cert-manager.io/v1", "CertificateRequest", NAMESPACE
            )
            if r["metadata"]["annotations"].get("cert-manager.io/certificate-name") == name
        ]
        assert requests and all(cert_manager.condition(r, "Approved") for r in requests), name
    assert issued.manager.lease_holder() is not None  # one controller, leading


def _served_certificate(issued: Issued, part: str) -> bytes:
    """The certificate a part's Service presents (DER), read with a client certificate of the
    CA (the cache engine requires one), verified against the CA and the Service's name."""
    name, ip = issued.service(part)
    ctx = issued.verify(client=True)

    def handshake() -> bytes:
        raw = socket.create_connection((ip, PORTS[part]), timeout=10)
        with ctx.wrap_socket(raw, server_hostname=name) as s:
            der = s.getpeercert(binary_form=True)
            assert der is not None
            return der

    return issued.node.cluster.ns.call(handshake)


@pytest.mark.slow
@pytest.mark.integration
def test_every_pod_is_ready_and_each_part_serves_its_issued_certificate(issued: Issued) -> None:
    pods = [
        p
        for ns in (NAMESPACE, FUNCTION_NAMESPACE)
        for p in issued.node.cluster.api.list("v1", "Pod", ns)
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") != "Succeeded"
    ]
    assert pods and all(pod_ready(p) for p in pods), pods_report(issued.node)
    for part in PARTS:
        pem = secret(issued.node, f"{RELEASE}-tls-{part}", "tls.crt")
        want = ssl.PEM_cert_to_DER_cert(pem[: pem.index("-----END CERTIFICATE-----") + 25])
        assert _served_certificate(issued, part) == want, part


@pytest.mark.slow
@pytest.mark.integration
def test_a_job_through_the_sdk_over_https_with_the_issuers_ca_is_exact_fedavg(
    issued: Issued,
) -> None:
    admin = secret(issued.node, f"{RELEASE}-tokens", "gateway-admin-secret")
    control_plane, _ = issued.service("control-plane")
    names = dict(issued.service(p) for p in PARTS)
    clients = [f"cm-{i}" for i in range(3)]
    url = f"https://{control_plane}:{PORTS['control-plane']}"
    analyst = secret(issued.node, f"{RELEASE}-tokens", "analyst-token")
    seen: list[Any] = []

    def gateway_found() -> bool:  # discovery over HTTPS, the gateway's issued certificate
        with resolving(names):
            r = get(issued.node, f"{url}/v1/nodes", analyst, issued.verify())
        assert r.status_code == 200, r.text
        seen[:] = r.json()["nodes"]
        return len(seen) == 1 and seen[0]["healthy"]

    try:
        wait_for(gateway_found, "the control plane finds the node gateway healthy", 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}\n{pods_report(issued.node)}") from None
    with resolving(names):
        job = NodeJob(
            issued.node.cluster.ns,
            url,
            admin,
            "k8s-cert-manager",
            clients,
            ca_file=str(issued.ca),
        )
        for i, c in enumerate(clients):
            assert job.upload(c, seed=700 + i).gateway_url.startswith("https://")
        h = job.wait()
        assert h["aggregated"] == 3 and h["lost"] == 0, h
        job.assert_fedavg()


def test_the_docs_say_what_ran_with_cert_manager_and_what_did_not() -> None:
    """docs/openfaas-kubernetes.md ("What ran here", "Not run here") and the chart's README
    name this module, the version the scripts build, the Issuer kind the test makes, and
    what was not shown; the old "no controller ran" is gone."""
    doc = " ".join((REPO / "docs" / "openfaas-kubernetes.md").read_text().split())
    ran = doc[doc.index("**What ran here**") : doc.index("**Not run here**")]
    not_run = doc[doc.index("**Not run here**") :]
    readme = " ".join((REPO / "charts" / "fedfaas" / "README.md").read_text().split())
    shown = readme[readme.index("What ran with cert-manager") : readme.index("## Values worth")]
    for text in (ran, shown):
        assert "`tests/k8s/test_chart_cert_manager.py`" in text
        assert f"cert-manager {cert_manager.VERSION}'s controller" in text
        assert "an Issuer of kind `CA`" in text and "`scripts/cert-manager-controller.sh`" in text
    for missing in ("webhook", "cainjector", "renewal"):
        assert missing in not_run and missing in shown, missing
    assert "No cert-manager controller ran" not in doc
    # the claims are this module's: the Issuer's kind, the checks named
    source = (REPO / "tests" / "k8s" / "cert_manager.py").read_text()
    assert '"spec": {"ca": {"secretName"' in source
    this = Path(__file__).read_text()
    for check in ("verify_directly_issued_by", "_served_certificate(", "job.assert_fedavg()"):
        assert check in this, check

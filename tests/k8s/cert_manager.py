"""cert-manager on a test cluster: its CRDs (scripts/cert-manager-crds.sh) and its controller
(scripts/cert-manager-controller.sh: cert-manager's own control loops of the version the CRDs
are, built from the Go module proxy into the cache by ``make k8s-binaries``), and a CA Issuer.

The controller runs as a process in the cluster's namespace (:meth:`PrivateNamespace.spawn`),
as upstream's runs outside a cluster: ``--kubeconfig`` (a client certificate of the cluster's
CA, group ``system:masters``: upstream's chart gives it narrower ClusterRoles) and a
leader-election Lease in a namespace of its own (:data:`NAMESPACE`). A CA Issuer needs nothing
else: no webhook (it only validates and defaults objects on their way in; the API server
checks the CRDs' schemas without it), no cainjector (it fills webhooks' caBundle), no ACME
solver pods.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.services import CACHE_DIR
from tests.k8s.api import KubeApi, conditions
from tests.k8s.cluster import SERVER, Cluster
from tests.k8s.pki import KeyPair
from tests.openfaas.conftest import wait_for

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
#: the version both scripts fetch (the same variable, the same default)
VERSION = os.environ.get("FEDFAAS_CERT_MANAGER_VERSION", "v1.19.2")
#: the controller's namespace: its Lease, and the CA Secrets of ClusterIssuers
NAMESPACE = "cert-manager"
CRD_API = "apiextensions.k8s.io/v1"


def controller_binary() -> Path | None:
    """The controller scripts/cert-manager-controller.sh caches; None if not built."""
    path = CACHE_DIR / "cert-manager" / VERSION / "cert-manager-controller"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def crds() -> list[dict[str, Any]]:
    """cert-manager's CRDs (the script downloads and checks them once, then reads the cache)."""
    res = subprocess.run(
        ["bash", str(SCRIPTS / "cert-manager-crds.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    folder = Path(res.stdout.strip().splitlines()[-1])
    docs = (yaml.safe_load_all(f.read_text()) for f in sorted(folder.glob("*.yaml")))
    return [d for file in docs for d in file if d]


def install_crds(api: KubeApi) -> None:
    """Create cert-manager's CRDs and wait until the API server serves each."""
    names = [api.create(crd)["metadata"]["name"] for crd in crds()]

    def established(name: str) -> bool:
        crd = api.get(CRD_API, "CustomResourceDefinition", name) or {}
        return condition(crd, "Established")

    wait_for(lambda: all(established(n) for n in names), "cert-manager's CRDs established", 60)


def condition(obj: dict[str, Any], kind: str) -> bool:
    """Whether ``obj``'s status has the condition ``kind`` True."""
    return conditions(obj).get(kind) == "True"


@dataclass
class CertManager:
    """The controller running in ``cluster``'s namespace, its log in ``log_path``."""

    cluster: Cluster
    proc: Any
    log_path: Path

    @classmethod
    def start(cls, cluster: Cluster, binary: Path, folder: Path) -> CertManager:
        """Its namespace, a kubeconfig of its own, then the controller (leader election on,
        in :data:`NAMESPACE`); returns once it holds the Lease."""
        cluster.api.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        cert = cluster.pki.issue("cert-manager", "cert-manager", org="system:masters", client=True)
        kubeconfig = cluster.pki.kubeconfig("cert-manager", SERVER, client=cert)
        argv = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--leader-election-namespace={NAMESPACE}",
            f"--cluster-resource-namespace={NAMESPACE}",
        ]
        log_path = folder / "cert-manager-controller.log"
        manager = cls(cluster, cluster.ns.spawn(argv, log_path), log_path)
        manager.wait(lambda: manager.lease_holder() is not None, "the leader-election Lease", 60)
        return manager

    def lease_holder(self) -> str | None:
        """Who holds the controller's Lease (None: nobody yet)."""
        lease = self.cluster.api.get(
            "coordination.k8s.io/v1", "Lease", "cert-manager-controller", NAMESPACE
        )
        return (lease or {}).get("spec", {}).get("holderIdentity") or None

    def log(self) -> str:
        """The tail of the controller's log (for failure messages)."""
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    def wait(self, ready: Any, what: str, timeout: float) -> None:
        """``wait_for(ready)``, failing at once if the controller exited; its log in the error."""

        def check() -> bool:
            assert self.proc.poll() is None, f"the controller exited ({self.proc.returncode})"
            return bool(ready())

        try:
            wait_for(check, what, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the controller's log ends with:\n{self.log()}") from None

    def ca_issuer(self, name: str, namespace: str, ca: KeyPair) -> dict[str, Any]:
        """An Issuer of kind CA signing with ``ca`` (its Secret ``<name>-ca`` made first);
        the Issuer once the controller set it Ready."""
        api = self.cluster.api
        pem = {"tls.crt": ca.cert.read_text(), "tls.key": ca.key.read_text()}
        meta = {"name": f"{name}-ca", "namespace": namespace}
        api.create({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": pem})
        api.create(
            {
                "apiVersion": "cert-manager.io/v1",
                "kind": "Issuer",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"ca": {"secretName": f"{name}-ca"}},
            }
        )
        seen: dict[str, Any] = {}

        def ready() -> bool:
            seen.update(api.get("cert-manager.io/v1", "Issuer", name, namespace) or {})
            return condition(seen, "Ready")

        self.wait(ready, f"the Issuer {namespace}/{name} Ready", 60)
        return seen

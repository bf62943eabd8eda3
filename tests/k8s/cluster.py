"""A Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager in a
private pid+mount+net namespace (:class:`tests.k8s.netns.PrivateNamespace`), with certificates
of its own (:class:`tests.k8s.pki.Pki`), everything in one folder of the test.

Alone, there is no kubelet and no scheduler: pods are created by the controllers and stay
Pending. :meth:`Cluster.add_node` registers a Node object by hand so that the DaemonSet
controller has a node to make a pod for. Binaries: kube-apiserver and kube-controller-manager
from the FedFaaS cache (``scripts/k8s-binaries.sh`` builds them from the Go module proxy),
Debian's etcd. :class:`tests.k8s.node.Node` adds a real node (the scheduler, containerd,
kubelet, kube-proxy) to a cluster started with every controller, its programs spawned the same
way, with certificates from the same :class:`Pki`.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.services import CACHE_DIR, find_binary
from tests.k8s.api import KubeApi
from tests.k8s.netns import NODE_IP, PrivateNamespace
from tests.k8s.pki import KeyPair, Pki
from tests.openfaas.conftest import wait_for

log = logging.getLogger(__name__)

#: the version scripts/k8s-binaries.sh builds (the same variable, the same default)
K8S_VERSION = os.environ.get("FEDFAAS_K8S_VERSION", "v1.34.12")
API_PORT = 6443
ETCD_PORT = 2379
SERVICE_CIDR = "10.96.0.0/16"
#: the first address of SERVICE_CIDR: the `kubernetes` Service's ClusterIP
SERVICE_IP = "10.96.0.1"
#: the address clients inside the namespace use
SERVER = f"https://{NODE_IP}:{API_PORT}"
# The node lifecycle controller taints a Node whose kubelet never reports (after its grace
# period): off, so that a Node made by hand (Cluster.add_node) keeps taking DaemonSet pods. A
# node with a kubelet turns it back on.
CONTROLLERS = "*,-node-lifecycle-controller"


def k8s_dir() -> Path:
    """Where scripts/k8s-binaries.sh caches the binaries of :data:`K8S_VERSION`."""
    return CACHE_DIR / "k8s" / K8S_VERSION


def binary(name: str) -> Path | None:
    """The Kubernetes binary ``name`` of the cache, or ``etcd`` (Debian's); None if missing."""
    if name == "etcd":
        found = find_binary("etcd")
        return Path(found) if found else None
    path = k8s_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


class Cluster:
    """etcd + kube-apiserver + kube-controller-manager in their own namespace.

    Parameters
    ----------
    folder
        The cluster's folder: ``pki/``, ``etcd/``, one log per program.
    binaries
        ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` -> path.
    controllers
        The controller manager's ``--controllers`` (:data:`CONTROLLERS`: no node lifecycle
        controller, for a Node made by hand; ``"*"`` with a kubelet).
    """

    def __init__(
        self, folder: Path, binaries: dict[str, Path], controllers: str = CONTROLLERS
    ) -> None:
        self.folder = folder
        self.binaries = binaries
        self.controllers = controllers
        self.ns = PrivateNamespace(folder / "ns")
        self.pki = Pki(folder / "pki")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.admin_cert: KeyPair | None = None
        self.admin_kubeconfig = folder / "pki" / "admin.kubeconfig"
        self._api: KubeApi | None = None

    @property
    def api(self) -> KubeApi:
        """The API as the admin (group ``system:masters``)."""
        assert self._api is not None, "the cluster is not started"
        return self._api

    def log(self, name: str) -> str:
        """The tail of a program's log (for failure messages)."""
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs[name] = self.ns.spawn(argv, self.folder / f"{name}.log", cwd=self.folder)

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        def check() -> bool:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited with code {self.procs[name].returncode}")
            return ready()

        try:
            wait_for(check, f"{name} ready", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log ends with:\n{self.log(name)}") from None

    # ------------------------------------------------------------------ programs
    def start(self, timeout: float = 180.0) -> Cluster:
        """Start the namespace, etcd, the API server and the controller manager; returns once
        the controllers work (the service-account controller made ``default/default``)."""
        self.ns.start()
        pki = self.pki
        etcd = pki.issue("etcd", "etcd", server=True, ips=("127.0.0.1",))
        etcd_client = pki.issue("apiserver-etcd-client", "kube-apiserver", client=True)
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            ips=("127.0.0.1", NODE_IP, SERVICE_IP),
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        sa = pki.service_account_keys()
        self.admin_cert = pki.issue("admin", "fedfaas-admin", org="system:masters", client=True)
        pki.kubeconfig("admin", SERVER, client=self.admin_cert)
        cm = pki.issue("controller-manager", "system:kube-controller-manager", client=True)
        cm_kubeconfig = pki.kubeconfig("controller-manager", SERVER, client=cm)

        self._spawn("etcd", self._etcd_argv(etcd))
        self._spawn("kube-apiserver", self._apiserver_argv(serving, etcd_client, sa))
        self._api = KubeApi(self.ns, SERVER, str(pki.ca.cert), self.admin_cert)
        self._wait("kube-apiserver", self._api_ready, timeout)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                f"--kubeconfig={cm_kubeconfig}",
                f"--authentication-kubeconfig={cm_kubeconfig}",
                f"--authorization-kubeconfig={cm_kubeconfig}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--controllers={self.controllers}",
            ],
        )
        self._wait(
            "kube-controller-manager",
            lambda: self.api.get("v1", "ServiceAccount", "default", "default") is not None,
            timeout,
        )
        return self

    def _etcd_argv(self, tls: KeyPair) -> list[str]:
        url = f"https://127.0.0.1:{ETCD_PORT}"
        return [
            str(self.binaries["etcd"]),
            "--name=default",
            f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            f"--cert-file={tls.cert}",
            f"--key-file={tls.key}",
            f"--trusted-ca-file={self.pki.ca.cert}",
            "--client-cert-auth",
        ]

    def _apiserver_argv(self, serving: KeyPair, etcd_client: KeyPair, sa: KeyPair) -> list[str]:
        return [
            str(self.binaries["kube-apiserver"]),
            f"--etcd-servers=https://127.0.0.1:{ETCD_PORT}",
            f"--etcd-cafile={self.pki.ca.cert}",
            f"--etcd-certfile={etcd_client.cert}",
            f"--etcd-keyfile={etcd_client.key}",
            "--bind-address=0.0.0.0",
            f"--secure-port={API_PORT}",
            f"--advertise-address={NODE_IP}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # as kubeadm sets it: the chart's eBPF node gateway is a privileged container
            "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            "--profiling=false",
            f"--cert-dir={self.folder / 'pki' / 'apiserver-generated'}",
        ]

    def _api_ready(self) -> bool:
        try:
            r = self.api.request("GET", "/readyz")
        except OSError:
            return False
        except Exception as exc:  # httpx's connection errors while it starts
            log.debug("kube-apiserver not ready: %s", exc)
            return False
        return r.status_code == 200

    def stop(self) -> None:
        """Stop everything (the namespace, so every process in it)."""
        if self._api is not None:
            self._api.close()
            self._api = None
        self.ns.stop()

    # ------------------------------------------------------------------ objects
    def add_node(self, name: str) -> dict[str, Any]:
        """A Node object, made by hand as a kubelet would register it (no kubelet runs it).

        The API server's TaintNodesByCondition admission gives a new Node the taint
        ``node.kubernetes.io/not-ready:NoSchedule``, which the node lifecycle controller takes
        off once the node's kubelet reports Ready; DaemonSet pods do not tolerate it. Without
        a kubelet (and with that controller off, :data:`CONTROLLERS`) the taint is taken off
        here, so that the DaemonSet controller makes its pod for the node.
        """
        self.api.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                },
            }
        )
        return self.api.patch("v1", "Node", name, None, {"spec": {"taints": None}})

"""A Kubernetes node for tests, in the private namespace of a :class:`tests.k8s.cluster.Cluster`:
kube-scheduler, containerd 1.6 with its CRI plugin (Debian's, with runc and the CNI plugins),
kubelet and kube-proxy, all v1.34 built from the Go module proxy (``scripts/k8s-binaries.sh``).

:meth:`Node.start` gives the namespace the folders kubelet and containerd hard-code (a tmpfs on
/run, overlays on /var/lib and /var/log; :func:`tests.k8s.node_files.setup_script`), starts
the scheduler and containerd, copies the images from podman's store into containerd's
``k8s.io`` namespace (the pod sandbox and CoreDNS images built by ``scripts/k8s-images.sh``
among them; nothing is pulled; :mod:`tests.k8s.containerd` keeps them from run to run, and
checks and repairs what a killed run left), then kubelet and kube-proxy, deploys CoreDNS
(``deploy/k8s/coredns.yaml``) and returns once the Node is Ready, kube-proxy healthy and CoreDNS
Ready. :meth:`Node.stop` stops the cluster (every process dies
with the namespace) and removes the cgroups kubelet made.

One node per machine at a time (a lock file in the cache): containerd's root, whose images are
kept from run to run, is the cache's (a test may give its own).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from tests.k8s.api import conditions
from tests.k8s.cluster import Cluster
from tests.k8s.containerd import CONTAINERD_ROOT, Containerd
from tests.k8s.netns import NODE_IP
from tests.k8s.node_files import CNI_BIN, kube_proxy_config, kubelet_config, setup_script
from tests.openfaas.conftest import wait_for

log = logging.getLogger(__name__)

#: the node's name (its kubelet's certificate names it: system:node:<name>)
NODE_NAME = "fedfaas-node"
#: the pod sandbox image scripts/k8s-images.sh builds
PAUSE_IMAGE = "localhost/fedfaas/pause:3.10.1"
#: the CoreDNS image scripts/k8s-images.sh builds (deploy/k8s/coredns.yaml names it)
COREDNS_IMAGE = "localhost/fedfaas/coredns:v1.12.1"
#: the cluster's DNS: CoreDNS, its RBAC and the kube-dns Service, as kubeadm deploys them
COREDNS_MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "coredns.yaml"
#: the node's programs, built into the cache by scripts/k8s-binaries.sh
NODE_BINARIES = ("kube-scheduler", "kubelet", "kube-proxy")
#: the Debian programs the node runs (scripts/setup.sh installs them)
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "podman")
#: one node at a time on this machine
NODE_LOCK = CONTAINERD_ROOT.parent / "node.lock"
CGROUP_FS = Path("/sys/fs/cgroup")


class NodeError(RuntimeError):
    """A part of the node did not start (the message names it, with its log's tail)."""


class Node:
    """kube-scheduler, containerd, kubelet and kube-proxy on ``cluster``'s namespace.

    Parameters
    ----------
    cluster
        The control plane, started, with the node lifecycle controller on (it takes the
        ``not-ready`` taint off the Node once kubelet reports Ready).
    binaries
        :data:`NODE_BINARIES` -> path.
    containerd_root
        containerd's root (the cache's, kept from run to run, unless a test gives its own).
    """

    def __init__(
        self,
        cluster: Cluster,
        binaries: dict[str, Path],
        containerd_root: Path = CONTAINERD_ROOT,
    ) -> None:
        self.cluster = cluster
        self.binaries = binaries
        self.folder = cluster.folder / "node"
        self.name = NODE_NAME
        self.containerd = Containerd(
            cluster.ns,
            self.folder,
            PAUSE_IMAGE,
            containerd_root,
            log_path=cluster.folder / "containerd.log",  # cluster.log("containerd")
        )
        #: the images :meth:`start` imported (the others were whole in containerd's root)
        self.imported: list[str] = []
        # a name of this node's own: a run killed before its cleanup leaves nothing the next
        # one trips over
        self.cgroup_root = f"fedfaas-k8s-{os.getpid()}-{id(self):x}"
        self._lock: IO[bytes] | None = None

    # ------------------------------------------------------------------ start
    def start(self, images: list[str], timeout: float = 300.0) -> Node:
        """Start the node with ``images`` (and :data:`PAUSE_IMAGE`) in containerd; returns once
        the Node is Ready and kube-proxy is healthy."""
        self.folder.mkdir(parents=True, exist_ok=True)
        NODE_LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(NODE_LOCK, "wb")  # noqa: SIM115 - held until stop()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._run_inside("sh", ["/bin/sh", "-c", setup_script(self.folder)])
        self._make_cgroups()
        self._start_scheduler()
        self._start_containerd(timeout)
        self._import_images([PAUSE_IMAGE, COREDNS_IMAGE, *images])
        self._start_kubelet(timeout)
        self._start_kube_proxy(timeout)
        self._deploy_dns(timeout)
        return self

    def _run_inside(
        self, name: str, argv: list[str], **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        wrapper = self.cluster.ns.wrapper(name, argv[0])
        res = subprocess.run(
            [str(wrapper), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **kw,
        )
        if res.returncode != 0:
            raise NodeError(f"{' '.join(argv[:3])}... in the namespace: {res.stderr.strip()}")
        return res

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.cluster.procs[name] = self.cluster.ns.spawn(
            argv, self.cluster.folder / f"{name}.log", cwd=self.folder
        )

    def _alive(self, name: str) -> None:
        proc = self.cluster.procs[name]
        if proc.poll() is not None:
            raise NodeError(
                f"{name} exited with code {proc.returncode}; its log ends with:\n"
                f"{self.cluster.log(name)}"
            )

    def _wait(self, name: str, ready: Any, what: str, timeout: float) -> None:
        def check() -> bool:
            self._alive(name)
            return bool(ready())

        try:
            wait_for(check, f"{name}: {what}", timeout)
        except AssertionError as exc:
            raise NodeError(f"{exc}; its log ends with:\n{self.cluster.log(name)}") from None

    def _make_cgroups(self) -> None:
        """kubelet's cgroupRoot in each v1 hierarchy (kubelet requires that it exists)."""
        for hierarchy in self._hierarchies(with_unified=False):
            (hierarchy / self.cgroup_root).mkdir(exist_ok=True)

    def _start_scheduler(self) -> None:
        pki = self.cluster.pki
        cert = pki.issue("scheduler", "system:kube-scheduler", client=True)
        kubeconfig = pki.kubeconfig("scheduler", self.cluster.api.server, client=cert)
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries["kube-scheduler"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
            ],
        )

    def _start_containerd(self, timeout: float) -> None:
        self.containerd.start(timeout)
        self._track_containerd()

    def _track_containerd(self) -> None:
        """The cluster stops containerd with the rest (it is started again where its root
        is made again)."""
        assert self.containerd.proc is not None
        self.cluster.procs["containerd"] = self.containerd.proc

    def _import_images(self, images: list[str]) -> None:
        try:
            self.imported = self.containerd.load(images)
        finally:
            if self.containerd.proc is not None:
                self._track_containerd()

    def _start_kubelet(self, timeout: float) -> None:
        pki = self.cluster.pki
        client = pki.issue("kubelet", f"system:node:{self.name}", org="system:nodes", client=True)
        kubeconfig = pki.kubeconfig("kubelet", self.cluster.api.server, client=client)
        serving = pki.issue(
            "kubelet-serving",
            f"system:node:{self.name}",
            server=True,
            ips=(NODE_IP,),
            dns=(self.name,),
        )
        resolv = self.folder / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\n")  # no DNS outside the cluster's
        config = self.folder / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    pki.ca.cert, (serving.cert, serving.key), resolv, f"/{self.cgroup_root}"
                )
            )
        )
        self._spawn(
            "kubelet",
            [
                str(self.binaries["kubelet"]),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
            ],
        )
        self._wait("kubelet", self.ready, f"Node {self.name} Ready without taints", timeout)

    def _start_kube_proxy(self, timeout: float) -> None:
        pki = self.cluster.pki
        cert = pki.issue("kube-proxy", "system:kube-proxy", client=True)
        kubeconfig = pki.kubeconfig("kube-proxy", self.cluster.api.server, client=cert)
        config = self.folder / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig, self.name)))
        self._spawn("kube-proxy", [str(self.binaries["kube-proxy"]), f"--config={config}"])

        def healthy() -> bool:
            try:
                r = self.cluster.ns.call(httpx.get, "http://127.0.0.1:10256/healthz", timeout=5)
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        self._wait("kube-proxy", healthy, "healthy (its rules programmed)", timeout)

    def _deploy_dns(self, timeout: float) -> None:
        """deploy/k8s/coredns.yaml; returns once CoreDNS is Ready (its ``ready`` plugin: the
        ``kubernetes`` plugin has synced with the API server through the ``kubernetes``
        Service, so through kube-proxy)."""
        for doc in yaml.safe_load_all(COREDNS_MANIFEST.read_text()):
            if doc:
                self.cluster.api.create(doc)

        def ready() -> bool:
            pods = self.cluster.api.list("v1", "Pod", "kube-system", selector="k8s-app=kube-dns")
            return any(pod_ready(p) for p in pods)

        self._wait("kubelet", ready, "CoreDNS Ready", timeout)

    # ------------------------------------------------------------------ state
    def node(self) -> dict[str, Any] | None:
        """The Node object, as kubelet registered it."""
        return self.cluster.api.get("v1", "Node", self.name)

    def ready(self) -> bool:
        """Whether the Node reports Ready and has no taint left."""
        node = self.node()
        if node is None:
            return False
        return conditions(node).get("Ready") == "True" and not node["spec"].get("taints")

    def pod_log(self, namespace: str, pod: str, tail: int = 2000) -> str:
        """The last ``tail`` characters of every container log of the pod (kubelet's
        /var/log/pods, bound here)."""
        out = []
        for path in sorted((self.folder / "pods").glob(f"{namespace}_{pod}_*/*/*.log")):
            out.append(f"== {path.parent.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Stop the cluster (the namespace: every process of the node dies with it), then
        remove kubelet's cgroups and let the next node have the cache's containerd root."""
        self.cluster.stop()
        try:
            wait_for(self._remove_cgroups, "kubelet's cgroups removed", 60)
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _hierarchies(self, with_unified: bool = True) -> list[Path]:
        """The host's cgroup hierarchies (runc also makes each container's cgroup in the v2
        ``unified`` one of a hybrid host; kubelet needs its root only in the v1 ones)."""
        return [
            p for p in CGROUP_FS.iterdir() if p.is_dir() and (with_unified or p.name != "unified")
        ]

    def _remove_cgroups(self) -> bool:
        """rmdir every cgroup under the root, deepest first; True once none is left (a cgroup
        whose last process is still exiting is busy for a moment)."""
        left = False
        for hierarchy in self._hierarchies():
            root = hierarchy / self.cgroup_root
            if not root.exists():
                continue
            for folder in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                try:
                    folder.rmdir()
                except OSError:
                    left = True
            try:
                root.rmdir()
            except OSError:
                left = True
        return not left

    def cgroups_left(self) -> list[Path]:
        """The cgroups of this node still in the host's tree (none after :meth:`stop`)."""
        return [
            h / self.cgroup_root for h in self._hierarchies() if (h / self.cgroup_root).exists()
        ]


def pod_ready(pod: dict[str, Any] | None) -> bool:
    """Whether the pod (an object of the API, or None) reports Ready."""
    return conditions(pod).get("Ready") == "True"


def missing_tools() -> list[str]:
    """The host programs of :data:`HOST_TOOLS` (and the CNI plugins) not installed."""
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if not (CNI_BIN / "bridge").exists():
        missing.append(f"{CNI_BIN}/bridge (containernetworking-plugins)")
    return missing

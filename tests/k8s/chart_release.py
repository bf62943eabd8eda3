"""FedFaaS's chart on a test node (:mod:`tests.k8s.node`): the values a node with no registry and
no storage provisioner needs, ``helm install --wait`` inside the node's namespace, and reading
the release's Secrets and pods back.

The images come from podman's store (``make images``; MinIO and Redis as deploy/faasd builds
them), imported into containerd by the node; MinIO and Redis keep their data in emptyDir
volumes (``persistence.enabled=false``: no PersistentVolume here).
"""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import httpx

from core.services import find_binary
from tests.k8s.conftest import Helm
from tests.k8s.faas_netes import FUNCTION_NAMESPACE
from tests.k8s.node import Node, pod_ready
from tests.polling import wait_until

CHART = Path(__file__).resolve().parents[2] / "charts" / "fedfaas"
RELEASE, NAMESPACE = "fedfaas", "openfaas"
TAG = "0.1.0"
#: the chart's images, as `make images` and scripts/k8s-images.sh name them
IMAGES = {
    "image": f"ghcr.io/fedfaas/fedfaas:{TAG}",
    "aggregator.image": f"ghcr.io/fedfaas/aggregator:{TAG}",
    "minio.image": f"localhost/fedfaas/minio-server:{TAG}",
    "redis.image": f"localhost/fedfaas/redis:{TAG}",
}


def chart_values(*extra: str) -> list[str]:
    """``--set`` arguments: the images of :data:`IMAGES`, no persistence, then ``extra``."""
    args = ["--set", "minio.persistence.enabled=false", "--set", "redis.persistence.enabled=false"]
    for key, ref in IMAGES.items():
        repository, tag = ref.rsplit(":", 1)
        args += ["--set", f"{key}.repository={repository}", "--set", f"{key}.tag={tag}"]
    return [*args, *extra]


def node_helm(node: Node, home: Path) -> Helm:
    """helm inside the node's namespace, as the cluster's admin."""
    binary = find_binary("helm")
    assert binary is not None, "helm (`make helm`)"
    return Helm(node.cluster.ns.wrapper("helm", binary), home, node.cluster.admin_kubeconfig)


def install(node: Node, home: Path, *extra: str) -> None:
    """``helm install --wait`` of the chart with :func:`chart_values` (``extra`` last); every
    pod's state and the logs of those not Ready in the error."""
    res = node_helm(node, home)(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--wait", "--timeout", "8m", *chart_values(*extra),
        timeout=600,
    )  # fmt: skip
    if res.returncode != 0:
        raise AssertionError(f"helm install: {res.stderr}\n{pods_report(node)}")
    wait_ready(node)


def wait_ready(node: Node, timeout: float = 180.0) -> None:
    """Wait until every pod of the release's namespaces is Ready (a Job's, the post-install
    hook's, and terminating pods aside: helm checked the hook). ``helm --wait`` does not: it
    counts a DaemonSet rolled out with ``maxUnavailable`` (1) pods not ready, so on one node
    it returns while the node gateway is still starting, or restarting after a first start
    that found Redis not listening yet (seen in CI: exit 1, "Connection refused", then
    CrashLoopBackOff's 10 s back-off)."""

    def ready() -> bool:
        for ns in (NAMESPACE, FUNCTION_NAMESPACE):
            for pod in node.cluster.api.list("v1", "Pod", ns):
                meta = pod["metadata"]
                a_job = any(o.get("kind") == "Job" for o in meta.get("ownerReferences", []))
                if not a_job and not meta.get("deletionTimestamp") and not pod_ready(pod):
                    return False
        return True

    try:
        wait_until(ready, timeout, "every pod of the release Ready", interval=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pods_report(node)}") from None


def pods_report(node: Node) -> str:
    """Each pod of the release's namespaces with its containers' states; the logs of those
    not Ready."""
    out = []
    for ns in (NAMESPACE, FUNCTION_NAMESPACE):
        for pod in node.cluster.api.list("v1", "Pod", ns):
            name = pod["metadata"]["name"]
            out.append(f"{ns}/{name}: {pod.get('status', {}).get('containerStatuses')}")
            if not pod_ready(pod):
                out.append(node.pod_log(ns, name))
    return "\n".join(out)


def secret(node: Node, name: str, key: str, namespace: str = NAMESPACE) -> str:
    """One key of one of the release's Secrets, decoded."""
    obj = node.cluster.api.get("v1", "Secret", name, namespace)
    assert obj is not None, name
    return base64.b64decode(obj["data"][key]).decode()


def get(
    node: Node,
    url: str,
    token: str,
    verify: ssl.SSLContext | bool = True,
    tls_name: str | None = None,
) -> httpx.Response:
    """``GET url`` with a bearer token (none for ``""``), from inside the node's namespace (an
    https server verified with ``verify``, its certificate against ``tls_name`` where given, as
    the platform's parts verify a gateway found at its pod's address: core/server_names.py)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    extensions = {"sni_hostname": tls_name} if tls_name else {}

    def call() -> httpx.Response:
        with httpx.Client(verify=verify, timeout=10) as client:
            return client.get(url, headers=headers, extensions=extensions)

    return node.cluster.ns.call(call)


def router_endpoints(
    node: Node,
    gateway_ip: str,
    token: str,
    tls: ssl.SSLContext | None = None,
    tls_name: str | None = None,
) -> list[dict[str, Any]]:
    """The aggregator endpoints registered with the gateway pod at ``gateway_ip`` (its
    ``/v1/router``, the gateway's own left out); over https verified with ``tls`` where given
    (against ``tls_name``, the node the gateway serves, where given)."""
    scheme = "https" if tls is not None else "http"
    r = get(node, f"{scheme}://{gateway_ip}:8081/v1/router", token, tls or True, tls_name)
    assert r.status_code == 200, r.text
    return [e for e in r.json()["endpoints"] if not e["local"]]

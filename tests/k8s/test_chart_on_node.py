"""FedFaaS's Helm chart on a real node (:mod:`tests.k8s.node`: kubelet, containerd, kube-proxy,
CoreDNS, in a namespace the test makes), with OpenFaaS's namespaces and ``basic-auth`` Secret as
OpenFaaS's chart makes them.

``helm install --wait`` with the chart's defaults except what a machine with no registry and no
storage provisioner needs: the images come from podman's store (``make images``, MinIO and Redis
as deploy/faasd builds them), MinIO and Redis keep their data in emptyDir volumes
(``persistence.enabled=false``: no PersistentVolume here). helm returns once every workload is
ready and its post-install hook, the MinIO provisioning Job, has completed; then:

- every pod of the release is Ready: MinIO, Redis, the node gateway (after its init container
  handed the hostPath folders to uid 12000), the aggregator in ``openfaas-fn``, the request
  tracker, the cache engine and the control plane;
- the aggregator pod registered its endpoint with the node gateway through the router socket
  they share by hostPath (the gateway's ``/v1/router``, with the admin token of the chart's
  Secret); the gateway runs the userspace router, eBPF not requested (the chart's default);
- the control plane found the node gateway through the headless Service and sees it healthy
  (``/v1/nodes``, with the analyst token);
- the provisioning Job made the bucket and the gateways' MinIO user: that user's credentials
  (the chart's Secret) reach the bucket, through MinIO's Service;
- faas-netes and OpenFaaS's gateway (processes in the namespace, as in
  test_chart_on_apiserver) scale the chart's aggregator to 2 (``POST
  /system/scale-function/aggregator``): kubelet starts the second pod, it becomes Ready and its
  endpoint registers with the node gateway beside the first;
- ``helm upgrade --set nodeGateway.ebpf.enabled=true``: the node gateway, now a privileged pod
  (the kernel headers, /sys/fs/bpf and debugfs by hostPath), loads its eBPF SK_MSG program, and
  the aggregator (now root, as the store's owner) registers with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from minio import Minio

from core.services import find_binary
from tests.k8s.chart_release import (
    CHART,
    IMAGES,
    NAMESPACE,
    RELEASE,
    chart_values,
    get,
    install,
    node_helm,
    pods_report,
    router_endpoints,
    secret,
)
from tests.k8s.faas_netes import FUNCTION_NAMESPACE, OpenFaaSOnCluster, install_openfaas_objects
from tests.k8s.node import Node, pod_ready
from tests.k8s.node_fixture import started_node
from tests.openfaas.conftest import require_binary, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COMPONENTS = {
    "minio",
    "redis",
    "node-gateway",
    "aggregator",
    "request-tracker",
    "cache-engine",
    "control-plane",
}


@pytest.fixture(scope="module")
def release(
    k8s_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    """The node with the chart installed (``helm install --wait``, hooks run)."""
    folder = tmp_path_factory.mktemp("k8s-chart")
    tools = () if find_binary("helm") else ("helm (`make helm`)",)
    with started_node(k8s_binaries, folder, list(IMAGES.values()), tools) as node:
        install_openfaas_objects(node.cluster, folder / "basic-auth")
        install(node, tmp_path_factory.mktemp("helm-home"))
        yield node


#: the post-install hook's Job (helm deletes the Job once it succeeded; its pod may linger)
HOOK = "minio-provision"


def _release_pods(node: Node) -> dict[str, dict[str, Any]]:
    """component -> its pod, for every pod of the release but the hook's, which must have
    succeeded where it is still there, and those terminating."""
    pods = {}
    for ns in (NAMESPACE, FUNCTION_NAMESPACE):
        for pod in node.cluster.api.list("v1", "Pod", ns):
            labels = pod["metadata"].get("labels", {})
            component = labels.get("app.kubernetes.io/component") or labels.get("faas_function")
            assert component, pod["metadata"]
            if pod["metadata"].get("deletionTimestamp"):
                continue  # replaced by an upgrade or a scale-down, terminating
            if component == HOOK:
                assert pod["status"]["phase"] == "Succeeded", pod["status"]
                continue
            assert component not in pods, f"two pods of {component}"
            pods[component] = pod
    return pods


def test_every_pod_of_the_release_is_ready(release: Node) -> None:
    pods = _release_pods(release)
    assert set(pods) == COMPONENTS, pods_report(release)
    assert all(pod_ready(p) for p in pods.values()), pods_report(release)
    assert all(p["spec"]["nodeName"] == release.name for p in pods.values())
    gateway = pods["node-gateway"]
    (init,) = gateway["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["reason"] == "Completed"


def test_the_aggregator_registers_with_the_node_gateway_through_the_shared_socket(
    release: Node,
) -> None:
    pods = _release_pods(release)
    gateway_ip = pods["node-gateway"]["status"]["podIP"]
    token = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")

    def registered() -> list[dict[str, Any]]:
        r = get(release, f"http://{gateway_ip}:8081/v1/router", token)
        assert r.status_code == 200, r.text
        return [e for e in r.json()["endpoints"] if not e["local"]]

    wait_for(lambda: bool(registered()), "the aggregator's endpoint registered", 120)
    status = get(release, f"http://{gateway_ip}:8081/v1/router", token).json()
    # eBPF off (the chart's default): the userspace router, and why
    assert (status["mode"], status["reason"]) == (
        "userspace",
        "eBPF not requested (prefer_ebpf=False)",
    )
    assert {e["uid"] for e in registered()} == {12000}  # the hostPaths' owner
    assert get(release, f"http://{gateway_ip}:8081/v1/router", "wrong").status_code == 401


def test_the_control_plane_finds_the_node_gateway_through_the_headless_service(
    release: Node,
) -> None:
    pods = _release_pods(release)
    url = f"http://{pods['control-plane']['status']['podIP']}:8070/v1/nodes"
    token = secret(release, f"{RELEASE}-tokens", "analyst-token")

    def healthy() -> bool:
        r = get(release, url, token)
        assert r.status_code == 200, r.text
        return [n["healthy"] for n in r.json()["nodes"]] == [True]

    wait_for(healthy, "the control plane sees the node gateway healthy", 120)


def test_the_provisioning_hook_made_the_bucket_and_the_gateways_user(release: Node) -> None:
    svc = release.cluster.api.get("v1", "Service", f"{RELEASE}-minio", NAMESPACE)
    assert svc is not None
    creds = json.loads(secret(release, f"{RELEASE}-minio-users", "minio-gateway.json"))
    endpoint = f"{svc['spec']['clusterIP']}:9000"

    def bucket_exists() -> bool:
        client = Minio(endpoint, creds["username"], creds["password"], secure=False)
        return client.bucket_exists("fedfaas")

    assert release.cluster.ns.call(bucket_exists)


def test_faas_netes_scales_the_aggregator_and_the_new_pod_registers(
    release: Node, faas_netes_binary: Path, tmp_path: Path
) -> None:
    cluster = release.cluster
    auth_dir = cluster.folder / "basic-auth"  # install_openfaas_objects wrote it
    auth = (
        (auth_dir / "basic-auth-user").read_text(),
        (auth_dir / "basic-auth-password").read_text(),
    )
    of = OpenFaaSOnCluster(cluster, auth, auth_dir, tmp_path)
    of.start(faas_netes_binary, require_binary("gateway"))
    gateway_ip = _release_pods(release)["node-gateway"]["status"]["podIP"]
    token = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")
    wait_for(lambda: bool(router_endpoints(release, gateway_ip, token)), "endpoints", 120)
    before = {e["id"] for e in router_endpoints(release, gateway_ip, token)}
    r = of.http(
        "POST",
        "/system/scale-function/aggregator",
        json={"serviceName": "aggregator", "replicas": 2},
    )
    assert r.status_code in (200, 202), r.text
    dep = cluster.api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
    assert dep is not None and dep["spec"]["replicas"] == 2

    def two_ready() -> bool:
        pods = cluster.api.list(
            "v1", "Pod", FUNCTION_NAMESPACE, selector="faas_function=aggregator"
        )
        return len(pods) == 2 and all(pod_ready(p) for p in pods)

    wait_for(two_ready, "two aggregator pods Ready", 180)

    def registered() -> bool:  # the new pod's endpoints, as many as the first pod's
        ids = {e["id"] for e in router_endpoints(release, gateway_ip, token)}
        return before < ids and len(ids) == 2 * len(before)

    wait_for(registered, "the new aggregator pod's endpoints registered with the gateway", 120)
    endpoints = router_endpoints(release, gateway_ip, token)
    assert {e["uid"] for e in endpoints} == {12000}  # the uid the hostPaths were handed to


def test_with_ebpf_on_the_privileged_gateway_loads_its_program(
    release: Node, tmp_path: Path
) -> None:
    res = node_helm(release, tmp_path)(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "5m",
        *chart_values(), "--set", "nodeGateway.ebpf.enabled=true",
        timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, f"{res.stderr}\n{pods_report(release)}"
    token = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")

    def loaded() -> bool:
        pods = _release_pods(release)
        gateway = pods["node-gateway"]
        if not pod_ready(gateway) or not gateway["spec"]["containers"][0]["securityContext"].get(
            "privileged"
        ):
            return False
        ip = gateway["status"]["podIP"]
        status = get(release, f"http://{ip}:8081/v1/router", token).json()
        assert (status["mode"], status["reason"]) == ("ebpf", "eBPF SK_MSG sidecar loaded"), status
        return {e["uid"] for e in status["endpoints"] if not e["local"]} == {0}

    wait_for(loaded, "the eBPF gateway, with the aggregator (root) registered", 180)

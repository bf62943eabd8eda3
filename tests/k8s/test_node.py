"""A real single-node Kubernetes (:mod:`tests.k8s.node`): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd with its CRI plugin, kubelet and kube-proxy
(v1.34 from the Go module proxy; Debian's etcd, containerd, runc and CNI plugins) and CoreDNS
as a pod, all in a pid+mount+net namespace the test makes and ends.

- kubelet registers the Node, which becomes Ready (cgroups v1 with the cgroupfs driver; the
  node lifecycle controller takes the ``not-ready`` taint off).
- A FedFaaS image (the ``echo`` function of stack.yml, from ``make images``) runs as a pod the
  scheduler binds, with its token from a Secret volume, Guaranteed QoS (an oom_score_adj of
  -997 that root without CAP_SYS_RESOURCE may not set: containerd keeps it at its own), its
  readiness probe passing; it answers HTTP from the test at its pod IP and, through kube-proxy's
  iptables rules, at its Service's ClusterIP: 401 without the token, its body echoed with it.
- CoreDNS (v1.12.1 from the Go module proxy, deploy/k8s/coredns.yaml) runs as a pod: another
  pod resolves the echo Service's name to its ClusterIP and reaches the echo pod through it.
- faas-netes and the real gateway (processes in the namespace, as in
  test_chart_on_apiserver): ``faas-cli deploy -f stack.yml --filter echo`` makes echo's
  Deployment, kubelet runs its pod with the ``fedfaas-function-token`` secret made by ``faas-cli
  secret create``, and it answers through the gateway; ``faas-cli remove`` takes it away.
- The host keeps nothing: the kernel settings kubelet wants are read from covers inside the
  namespace (the host's are unchanged), kubelet's cgroups are removed and every process ends
  with the namespace.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.containers.conftest import stack_images
from tests.k8s.api import conditions
from tests.k8s.cluster import K8S_VERSION
from tests.k8s.faas_netes import (
    FUNCTION_NAMESPACE,
    OpenFaaSOnCluster,
    install_openfaas_objects,
    keep_imported_images,
)
from tests.k8s.node import Node, pod_ready
from tests.k8s.node_files import POD_CIDR
from tests.k8s.node_fixture import started_node
from tests.openfaas.conftest import FaasCli, require_binary, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "fedfaas-node-test"
TOKEN = "node-test-token"  # a test value, in a Secret of the test's cluster only


def _echo_image() -> str:
    return stack_images(REPO / "stack.yml")["echo"]


@pytest.fixture(scope="module")
def node(k8s_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The cluster with its node, started once for the module; stopped after, with a check
    that nothing of it is left."""
    folder = tmp_path_factory.mktemp("k8s-node")
    with started_node(k8s_binaries, folder, [_echo_image()]) as n:
        yield n


def test_the_node_registers_and_becomes_ready(node: Node) -> None:
    obj = node.node()
    assert obj is not None
    info = obj["status"]["nodeInfo"]
    assert info["kubeletVersion"] == K8S_VERSION
    assert info["kubeProxyVersion"] in ("", K8S_VERSION)  # deprecated field, may be empty
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert node.ready()
    assert conditions(obj) == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
    }


def _echo_objects() -> list[dict[str, Any]]:
    labels = {"app": "echo"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "fedfaas-function-token", "namespace": NAMESPACE},
            "stringData": {"fedfaas-function-token": TOKEN},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "echo", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "echo",
                        "image": _echo_image(),
                        "imagePullPolicy": "Never",  # imported, never pulled
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/_/health", "port": 8080}},
                        # requests = limits: Guaranteed, oom_score_adj -997 asked for
                        "resources": {"limits": {"cpu": "250m", "memory": "256Mi"}},
                        "volumeMounts": [
                            {
                                "name": "token",
                                "mountPath": "/var/openfaas/secrets",
                                "readOnly": True,
                            }
                        ],
                    }
                ],
                "volumes": [{"name": "token", "secret": {"secretName": "fedfaas-function-token"}}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo", "namespace": NAMESPACE},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    ]


@pytest.fixture(scope="module")
def echo_pod(node: Node) -> dict[str, Any]:
    """The echo pod, Ready (its readiness probe passed)."""
    api = node.cluster.api
    for obj in _echo_objects():
        api.create(obj)

    try:
        wait_for(lambda: pod_ready(api.get("v1", "Pod", "echo", NAMESPACE)), "echo Ready", 180)
    except AssertionError as exc:
        pod = api.get("v1", "Pod", "echo", NAMESPACE)
        raise AssertionError(
            f"{exc}: {pod and pod.get('status')}\n{node.pod_log(NAMESPACE, 'echo')}\n"
            f"kubelet: {node.cluster.log('kubelet')}"
        ) from None
    pod = api.get("v1", "Pod", "echo", NAMESPACE)
    assert pod is not None
    return pod


def _http(node: Node, method: str, url: str, **kw: Any) -> httpx.Response:
    return node.cluster.ns.call(httpx.request, method, url, timeout=10, **kw)


def _answers_like_echo(node: Node, base: str) -> None:
    # of-watchdog's /_/health (the readiness probe) passes once the watchdog runs; until the
    # function's own server listens behind it, the watchdog answers 500. Through the gateway,
    # faas-netes answers 502/503 until its Endpoints watch has seen the Ready pod, which may
    # lag the Deployment's readyReplicas. So the wait is for the function's own answer to a
    # request without a credential (401); the last other answer is in the failure.
    last: list[httpx.Response] = []

    def answers() -> bool:
        try:
            last[:] = [_http(node, "GET", base)]
        except httpx.HTTPError:
            return False
        return last[0].status_code == 401

    try:
        wait_for(answers, f"the echo function answers at {base}", 60)
    except AssertionError as exc:
        said = f"{last[0].status_code} {last[0].text[:300]}" if last else "no HTTP answer"
        raise AssertionError(f"{exc}: its last answer: {said}") from None
    denied = last[0]
    assert denied.json()["error"] == "unauthorized"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = b"a body from the test\x00\xff"
    echoed = _http(node, "POST", base, content=body, headers=auth)
    assert echoed.status_code == 200, echoed.text
    assert echoed.content == body
    about = _http(node, "GET", base, headers=auth)
    assert about.status_code == 200 and about.json()["function"] == "echo", about.text


def test_a_fedfaas_image_runs_as_a_scheduled_pod(node: Node, echo_pod: dict[str, Any]) -> None:
    assert echo_pod["spec"]["nodeName"] == node.name  # bound by the scheduler
    assert echo_pod["status"]["qosClass"] == "Guaranteed"
    ip = echo_pod["status"]["podIP"]
    assert ip.startswith(POD_CIDR.rsplit(".", 1)[0] + ".")
    _answers_like_echo(node, f"http://{ip}:8080/")


def test_its_service_answers_through_kube_proxy(node: Node, echo_pod: dict[str, Any]) -> None:
    svc = node.cluster.api.get("v1", "Service", "echo", NAMESPACE)
    assert svc is not None
    cluster_ip = svc["spec"]["clusterIP"]

    def routed() -> bool:  # kube-proxy writes the rules once the endpoints are known
        try:
            return _http(node, "GET", f"http://{cluster_ip}/").status_code == 401
        except httpx.HTTPError:
            return False

    wait_for(routed, f"the Service's ClusterIP {cluster_ip} routed to the pod", 120)
    _answers_like_echo(node, f"http://{cluster_ip}/")


#: run in a pod of the echo image: the echo Service by its name (the pod's resolv.conf names
#: CoreDNS's Service; CoreDNS answers from the API server), then an HTTP GET to it
_CLIENT = """
import socket, urllib.error, urllib.request
name = "echo.%s.svc.cluster.local"
print("resolved", socket.gethostbyname(name), flush=True)
try:
    urllib.request.urlopen("http://echo.%s/", timeout=10)
except urllib.error.HTTPError as exc:
    print("answered", exc.code, flush=True)
"""


def test_a_pod_reaches_the_service_by_its_name_through_coredns(
    node: Node, echo_pod: dict[str, Any]
) -> None:
    api = node.cluster.api
    svc = api.get("v1", "Service", "echo", NAMESPACE)
    assert svc is not None
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client", "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "client",
                        "image": _echo_image(),
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", _CLIENT % (NAMESPACE, NAMESPACE)],
                    }
                ],
            },
        }
    )

    def ended() -> bool:
        pod = api.get("v1", "Pod", "client", NAMESPACE)
        return (pod or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")

    wait_for(ended, "the client pod ended", 120)
    pod = api.get("v1", "Pod", "client", NAMESPACE)
    out = node.pod_log(NAMESPACE, "client")
    assert pod is not None and pod["status"]["phase"] == "Succeeded", out
    assert f"resolved {svc['spec']['clusterIP']}" in out
    assert "answered 401" in out  # the echo pod, on the same bridge, without the token


@pytest.fixture(scope="module")
def openfaas_on_node(
    node: Node, faas_netes_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> OpenFaaSOnCluster:
    """faas-netes and the real gateway in the node's namespace."""
    gateway = require_binary("gateway")
    auth_dir = node.cluster.folder / "basic-auth"
    auth = install_openfaas_objects(node.cluster, auth_dir)
    of = OpenFaaSOnCluster(node.cluster, auth, auth_dir, tmp_path_factory.mktemp("openfaas"))
    of.start(faas_netes_binary, gateway)
    return of  # its processes die with the namespace


def _use_imported_image(node: Node, function: str) -> None:
    api = node.cluster.api

    def made() -> bool:
        return api.get("apps/v1", "Deployment", function, FUNCTION_NAMESPACE) is not None

    wait_for(made, f"faas-netes made the {function} Deployment", 60)
    dep = api.get("apps/v1", "Deployment", function, FUNCTION_NAMESPACE)
    assert dep is not None
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert [c["imagePullPolicy"] for c in containers] == ["Always"]
    assert keep_imported_images(api) == [function]


def test_faas_cli_deploys_echo_through_faas_netes_and_it_answers_through_the_gateway(
    node: Node, openfaas_on_node: OpenFaaSOnCluster, tmp_path: Path
) -> None:
    of = openfaas_on_node
    cli = FaasCli(node.cluster.ns.wrapper("faas-cli", require_binary("faas-cli")), tmp_path)
    cli.gateway = of.url
    user, password = of.auth
    cli.ok("login", "--username", user, "--password-stdin", stdin=password)
    token_file = tmp_path / "function-token"
    token_file.write_text(TOKEN)
    cli.ok("secret", "create", "fedfaas-function-token", "--from-file", str(token_file))
    # stack.yml unchanged: its provider gateway is this one (127.0.0.1:8080 in the namespace)
    cli.ok("deploy", "-f", "stack.yml", "--filter", "echo", cwd=REPO)
    # faas-netes' last MIT build gives every function `imagePullPolicy: Always` whatever its
    # image_pull_policy says (it logs "ImagePullPolicy: Always"), and no registry answers here:
    # the Deployment it made is patched to use the image imported into containerd
    _use_imported_image(node, "echo")

    def available() -> bool:  # rolled out: one pod, of the patched template, Ready
        dep = node.cluster.api.get("apps/v1", "Deployment", "echo", FUNCTION_NAMESPACE)
        status = (dep or {}).get("status", {})
        pods = node.cluster.api.list("v1", "Pod", FUNCTION_NAMESPACE, selector="faas_function=echo")
        return (
            dep is not None
            and status.get("observedGeneration") == dep["metadata"]["generation"]
            and status.get("updatedReplicas") == status.get("readyReplicas") == 1
            and len(pods) == 1
        )

    try:
        wait_for(available, "faas-netes' echo Deployment with a Ready pod", 180)
    except AssertionError as exc:
        pods = node.cluster.api.list("v1", "Pod", FUNCTION_NAMESPACE)
        raise AssertionError(
            f"{exc}: {[p.get('status') for p in pods]}\n"
            f"{[node.pod_log(FUNCTION_NAMESPACE, p['metadata']['name']) for p in pods]}\n"
            f"faas-netes: {of.log('faas-netes')}\nkubelet: {node.cluster.log('kubelet')[-2000:]}"
        ) from None
    (pod,) = node.cluster.api.list("v1", "Pod", FUNCTION_NAMESPACE, selector="faas_function=echo")
    assert pod["spec"]["nodeName"] == node.name
    assert pod["spec"]["containers"][0]["image"] == _echo_image()
    _answers_like_echo(node, f"{of.url}/function/echo")
    assert "echo" in cli.ok("list")
    cli.ok("remove", "echo")
    wait_for(
        lambda: (
            not node.cluster.api.list(
                "v1", "Pod", FUNCTION_NAMESPACE, selector="faas_function=echo"
            )
        ),
        "the echo pod removed",
        120,
    )

"""FedFaaS's Helm chart on a real node (:mod:`tests.k8s.node`: kubelet, containerd, kube-proxy,
CoreDNS, in a namespace the test makes), with OpenFaaS's namespaces and ``basic-auth`` Secret as
OpenFaaS's chart makes them.

``helm install --wait`` with the chart's defaults except what a machine with no registry and no
storage provisioner needs, and TLS on from Secrets (:mod:`tests.k8s.chart_tls`: the test mints
a CA and each part's certificate with openssl and makes the Secrets ``<prefix>-<part>`` before
the install, as an operator would): the images come from podman's store (``make images``, MinIO
and Redis as deploy/faasd builds them), MinIO and Redis keep their data in emptyDir volumes
(``persistence.enabled=false``: no PersistentVolume here). helm returns once every workload is
ready and its post-install hook, the MinIO provisioning Job, has completed; then:

- every pod of the release is Ready: MinIO, Redis, the node gateway (after its init containers
  copied its TLS files to a 0600 key and handed the hostPath folders to uid 12000), the
  aggregator in ``openfaas-fn``, the request tracker, the cache engine and the control plane
  (each after its TLS init container); kubelet probes the TLS parts over HTTPS (the cache
  engine, which requires client certificates, with a TCP connect), and each part started,
  which it does not with a key others can read;
- the aggregator pod registered its endpoint with the node gateway through the router socket
  they share by hostPath (the gateway's ``/v1/router`` over HTTPS, with the admin token of the
  chart's Secret); the gateway runs the userspace router, eBPF not requested (the chart's
  default);
- the control plane found the node gateway through the headless Service over HTTPS (its
  certificate names the node) and sees it healthy (``/v1/nodes``, with the analyst token);
- plain HTTP to the gateway's and the control plane's Services is answered 400
  ``tls_required``; a client certificate of another CA is refused at the handshake by the
  gateway, the control plane and the cache engine, which also refuses a client without one
  and admits one of the CA;
- the provisioning Job made the bucket and the gateways' MinIO user: that user's credentials
  (the chart's Secret) reach the bucket, through MinIO's Service;
- a job of 2 rounds through the SDK over HTTPS (``ca_file``, the Secrets' CA): the control
  plane at its Service's name, clients placed on the gateway at its ``https://POD_IP`` address,
  verified against the node's name (the gateway's certificate names no address); round 1's
  model is the float64 FedAvg of the updates;
- faas-netes and OpenFaaS's gateway (processes in the namespace, as in
  test_chart_on_apiserver) scale the chart's aggregator to 2 (``POST
  /system/scale-function/aggregator``): kubelet starts the second pod, it becomes Ready and its
  endpoint registers with the node gateway beside the first;
- ``helm upgrade --set nodeGateway.ebpf.enabled=true`` (TLS still on): the node gateway, now a
  privileged pod (the kernel headers, /sys/fs/bpf and debugfs by hostPath), loads its eBPF
  SK_MSG program, and the aggregator (now root, as the store's owner) registers with it;
- last, on that gateway (root), the job's round 2, in the store uid 12000 made (handed to root
  by the ``node-folders`` init container), is the float64 FedAvg of its updates.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from minio import Minio

from core.services import find_binary
from tests.k8s import chart_tls
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
from tests.k8s.node import NODE_NAME, Node, pod_ready
from tests.k8s.node_fixture import started_node
from tests.k8s.sdk_job import NodeJob
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
def pki(tmp_path_factory: pytest.TempPathFactory) -> chart_tls.ChartPki:
    """The release's CA and certificates (its one gateway serves the node)."""
    folder = tmp_path_factory.mktemp("k8s-chart-tls")
    return chart_tls.mint(folder, RELEASE, NAMESPACE, [NODE_NAME])


@pytest.fixture(scope="module")
def release(
    k8s_binaries: dict[str, Path],
    pki: chart_tls.ChartPki,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Node]:
    """The node with the chart installed with TLS from Secrets (``helm install --wait``, hooks
    run)."""
    folder = tmp_path_factory.mktemp("k8s-chart")
    tools = () if find_binary("helm") else ("helm (`make helm`)",)
    with started_node(k8s_binaries, folder, list(IMAGES.values()), tools) as node:
        install_openfaas_objects(node.cluster, folder / "basic-auth")
        chart_tls.create_secrets(node.cluster.api, pki, NAMESPACE)
        install(node, tmp_path_factory.mktemp("helm-home"), *chart_tls.VALUES)
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


#: the TLS parts' ports (the cache engine requires client certificates)
TLS_PORTS = {
    "node-gateway": 8081,
    "control-plane": 8070,
    "cache-engine": 8091,
    "request-tracker": 8092,
}


def test_every_pod_of_the_release_is_ready(release: Node) -> None:
    pods = _release_pods(release)
    assert set(pods) == COMPONENTS, pods_report(release)
    assert all(pod_ready(p) for p in pods.values()), pods_report(release)
    assert all(p["spec"]["nodeName"] == release.name for p in pods.values())
    gateway = pods["node-gateway"]
    inits = {i["name"]: i for i in gateway["status"]["initContainerStatuses"]}
    assert set(inits) == {"tls-files", "node-folders"}, inits
    assert all(i["state"]["terminated"]["reason"] == "Completed" for i in inits.values())
    for part in TLS_PORTS:  # probed over HTTPS; the engine (mTLS only) with a TCP connect
        (init,) = [
            i for i in pods[part]["status"]["initContainerStatuses"] if i["name"] == "tls-files"
        ]
        assert init["state"]["terminated"]["reason"] == "Completed", init
        container = pods[part]["spec"]["containers"][0]
        probe = container["readinessProbe"]
        if part == "cache-engine":
            assert "tcpSocket" in probe, probe
        else:
            assert probe["httpGet"]["scheme"] == "HTTPS", probe
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["tls"]["readOnly"] and "tls-secret" not in mounts, mounts


def test_the_aggregator_registers_with_the_node_gateway_through_the_shared_socket(
    release: Node, pki: chart_tls.ChartPki
) -> None:
    pods = _release_pods(release)
    gateway = f"https://{pods['node-gateway']['status']['podIP']}:8081"
    token = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")
    verify = pki.verify()

    def registered() -> list[dict[str, Any]]:
        r = get(release, f"{gateway}/v1/router", token, verify, release.name)
        assert r.status_code == 200, r.text
        return [e for e in r.json()["endpoints"] if not e["local"]]

    wait_for(lambda: bool(registered()), "the aggregator's endpoint registered", 120)
    status = get(release, f"{gateway}/v1/router", token, verify, release.name).json()
    # eBPF off (the chart's default): the userspace router, and why
    assert (status["mode"], status["reason"]) == (
        "userspace",
        "eBPF not requested (prefer_ebpf=False)",
    )
    assert {e["uid"] for e in registered()} == {12000}  # the hostPaths' owner
    assert get(release, f"{gateway}/v1/router", "wrong", verify, release.name).status_code == 401


def test_the_control_plane_finds_the_node_gateway_through_the_headless_service(
    release: Node, pki: chart_tls.ChartPki
) -> None:
    node = _gateway_seen_healthy(release, pki)
    # found at its pod's https address, its certificate naming the node
    gateway = f"https://{_release_pods(release)['node-gateway']['status']['podIP']}:8081"
    assert (node["name"], node["url"]) == (release.name, gateway), node


def _gateway_seen_healthy(release: Node, pki: chart_tls.ChartPki) -> dict[str, Any]:
    """The control plane's one node once it is healthy at the gateway pod's address of now
    (``GET /v1/nodes`` over HTTPS, by the control plane's Service name)."""
    control_plane = _service_url("control-plane", 8070)
    token = secret(release, f"{RELEASE}-tokens", "analyst-token")
    seen: list[dict[str, Any]] = []

    def healthy() -> bool:
        ip = _release_pods(release)["node-gateway"]["status"].get("podIP")
        with chart_tls.resolving(_service_addresses(release)):
            r = get(release, f"{control_plane}/v1/nodes", token, pki.verify())
        assert r.status_code == 200, r.text
        seen[:] = r.json()["nodes"]
        return [(n["healthy"], n["url"]) for n in seen] == [(True, f"https://{ip}:8081")]

    wait_for(healthy, "the control plane sees the node gateway's pod healthy", 120)
    return seen[0]


def _service_url(part: str, port: int) -> str:
    """A part's https URL by its Service's DNS name (the name its certificate carries)."""
    return f"https://{RELEASE}-{part}.{NAMESPACE}.svc:{port}"


def _service_addresses(node: Node) -> dict[str, str]:
    """Each TLS part's Service name -> its ClusterIP (a hosts file's lines)."""
    out = {}
    for part in TLS_PORTS:
        svc = node.cluster.api.get("v1", "Service", f"{RELEASE}-{part}", NAMESPACE)
        assert svc is not None, part
        out[f"{RELEASE}-{part}.{NAMESPACE}.svc"] = str(svc["spec"]["clusterIP"])
    return out


def _handshake(node: Node, address: tuple[str, int], ctx: ssl.SSLContext) -> bytes:
    """``GET /healthz`` over TLS to ``address`` from the node's namespace: the answer's status
    line. TLS 1.3: a server refuses a client's certificate after the client's handshake ended,
    so a refusal is an error on the first read (an end without TLS's close too)."""
    ctx.check_hostname = False  # the Service's address: the chain is what is checked here

    def call() -> bytes:
        raw = socket.create_connection(address, timeout=10)
        with ctx.wrap_socket(raw, suppress_ragged_eofs=False) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with s.makefile("rb") as answer:
                return answer.readline()

    return node.cluster.ns.call(call)


def test_plain_http_and_another_cas_certificate_are_refused(
    release: Node, pki: chart_tls.ChartPki
) -> None:
    addresses = _service_addresses(release)
    for part in ("node-gateway", "control-plane"):
        ip = addresses[f"{RELEASE}-{part}.{NAMESPACE}.svc"]
        for r in (
            release.cluster.ns.call(httpx.get, f"http://{ip}:{TLS_PORTS[part]}/healthz"),
            release.cluster.ns.call(
                httpx.post, f"http://{ip}:{TLS_PORTS[part]}/v1/jobs", content=b"x" * 65536
            ),
        ):
            assert r.status_code == 400, (part, r.status_code, r.text)
            assert r.json()["error"] == "tls_required", r.text
            assert "https://" in r.json()["detail"], r.text
    for part, port in TLS_PORTS.items():
        address = (addresses[f"{RELEASE}-{part}.{NAMESPACE}.svc"], port)
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            _handshake(release, address, pki.verify(pki.stranger))
        if part == "cache-engine":  # only the parts call it: a certificate of the CA only
            with pytest.raises((ssl.SSLError, ConnectionResetError)):
                _handshake(release, address, pki.verify())
            assert b" 200 " in _handshake(release, address, pki.verify(pki.operator))
        else:  # the SDK's kind, without a certificate, is let in
            assert b" 200 " in _handshake(release, address, pki.verify())


def test_the_provisioning_hook_made_the_bucket_and_the_gateways_user(release: Node) -> None:
    svc = release.cluster.api.get("v1", "Service", f"{RELEASE}-minio", NAMESPACE)
    assert svc is not None
    creds = json.loads(secret(release, f"{RELEASE}-minio-users", "minio-gateway.json"))
    endpoint = f"{svc['spec']['clusterIP']}:9000"

    def bucket_exists() -> bool:
        client = Minio(endpoint, creds["username"], creds["password"], secure=False)
        return client.bucket_exists("fedfaas")

    assert release.cluster.ns.call(bucket_exists)


@pytest.fixture(scope="module")
def job(release: Node, pki: chart_tls.ChartPki) -> NodeJob:
    """A job of 2 rounds over HTTPS (``ca_file``, the Secrets' CA), made before the eBPF
    upgrade: its store on the node is made by the gateway's uid 12000."""
    admin = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")
    with chart_tls.resolving(_service_addresses(release)):
        return NodeJob(
            release.cluster.ns,
            _service_url("control-plane", 8070),
            admin,
            "k8s-tls",
            [f"tls-{i}" for i in range(4)],
            ca_file=str(pki.ca),
            rounds=2,
        )


def _round_is_exact_fedavg(release: Node, pki: chart_tls.ChartPki, job: NodeJob, rnd: int) -> None:
    """Each client's update of round ``rnd`` through the SDK, to the gateway at its
    ``https://POD_IP`` address, verified against the node's name (its certificate names no
    address); the round's model is the float64 FedAvg of the updates."""
    _gateway_seen_healthy(release, pki)  # the gateway pod of now, found again
    with chart_tls.resolving(_service_addresses(release)):
        gateway_ip = _release_pods(release)["node-gateway"]["status"]["podIP"]
        for i, c in enumerate(job.clients):
            a = job.upload(c, seed=500 + 10 * rnd + i, rnd=rnd)
            assert a.gateway_url == f"https://{gateway_ip}:8081", a
        h = job.wait(rnd)
        assert h["aggregated"] == 4 and h["lost"] == 0, h
        job.assert_fedavg(rnd)


def test_a_job_through_the_sdk_over_https_is_exact_fedavg(
    release: Node, pki: chart_tls.ChartPki, job: NodeJob
) -> None:
    """Round 1 of the job, before the upgrade below: the gateway (uid 12000) keeps the job's
    store on the node, the published model and the open round 2, for the gateway after it."""
    _round_is_exact_fedavg(release, pki, job, 1)


def test_faas_netes_scales_the_aggregator_and_the_new_pod_registers(
    release: Node, pki: chart_tls.ChartPki, faas_netes_binary: Path, tmp_path: Path
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
    wait_for(
        lambda: bool(router_endpoints(release, gateway_ip, token, pki.verify(), release.name)),
        "endpoints",
        120,
    )
    before = {
        e["id"] for e in router_endpoints(release, gateway_ip, token, pki.verify(), release.name)
    }
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
        ids = {
            e["id"]
            for e in router_endpoints(release, gateway_ip, token, pki.verify(), release.name)
        }
        return before < ids and len(ids) == 2 * len(before)

    wait_for(registered, "the new aggregator pod's endpoints registered with the gateway", 120)
    endpoints = router_endpoints(release, gateway_ip, token, pki.verify(), release.name)
    assert {e["uid"] for e in endpoints} == {12000}  # the uid the hostPaths were handed to


def test_with_ebpf_on_the_privileged_gateway_loads_its_program(
    release: Node, pki: chart_tls.ChartPki, tmp_path: Path
) -> None:
    res = node_helm(release, tmp_path)(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "5m",
        *chart_values(*chart_tls.VALUES), "--set", "nodeGateway.ebpf.enabled=true",
        timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, f"{res.stderr}\n{pods_report(release)}"
    token = secret(release, f"{RELEASE}-tokens", "gateway-admin-secret")

    seen: dict[str, Any] = {}

    def loaded() -> bool:
        # the gateway's pod alone: while the upgrade rolls the aggregator (its uid changes),
        # its old pod can be there, not yet terminating, beside the new one for a moment,
        # which _release_pods rightly refuses in a settled release
        gateways = [
            p
            for p in release.cluster.api.list("v1", "Pod", NAMESPACE)
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "node-gateway"
            and not p["metadata"].get("deletionTimestamp")
        ]
        if len(gateways) != 1:
            return False
        [gateway] = gateways
        seen.update(gateway=gateway["metadata"]["name"], ready=pod_ready(gateway))
        if not pod_ready(gateway) or not gateway["spec"]["containers"][0]["securityContext"].get(
            "privileged"
        ):
            return False
        ip = gateway["status"]["podIP"]
        status = get(
            release, f"https://{ip}:8081/v1/router", token, pki.verify(), release.name
        ).json()
        assert (status["mode"], status["reason"]) == ("ebpf", "eBPF SK_MSG sidecar loaded"), status
        seen["endpoints"] = status["endpoints"]
        return {e["uid"] for e in status["endpoints"] if not e["local"]} == {0}

    try:
        wait_for(loaded, "the eBPF gateway, with the aggregator (root) registered", 180)
    except AssertionError as exc:  # what it saw last, and the pods
        log = release.pod_log(NAMESPACE, seen["gateway"], tail=40) if seen else ""
        raise AssertionError(f"{exc}; last seen {seen}\n{log}\n{pods_report(release)}") from None


def test_the_job_from_before_the_upgrade_ends_on_the_ebpf_gateway(
    release: Node, pki: chart_tls.ChartPki, job: NodeJob
) -> None:
    """Last: the eBPF gateway (root) resumed the job from the store uid 12000 made (the
    ``node-folders`` init container handed it over; before, the root gateway refused a store
    folder another uid owned and stayed in CrashLoopBackOff), and its round 2 is exact."""
    _round_is_exact_fedavg(release, pki, job, 2)

"""The README's FL job on the real node (:mod:`tests.k8s.node`), from outside the cluster.

The node runs the chart with two node gateways (``nodeGateway.perNode=2``: two DaemonSets, each a
node of its own to the control plane with its own host folders and aggregator function, as
`fedfaas up` runs two gateways on one machine), OpenFaaS's gateway and faas-netes (processes
beside the cluster, published to the pods as the Service ``gateway.openfaas``, the chart's
``gatewayURL``), and ``digits-evaluator`` deployed with faas-cli through them.

The chart runs with its DEFAULT TLS: every FedFaaS part serves HTTPS from certificates the chart
made (a CA generated at the install, the Secret ``fedfaas-tls-ca``; each part's certificate
signed with it, the gateways' naming the node's name and ``<node>-1``, none a pod address).
The SDK takes the CA from the chart's Secret (``ca_file``).

"Outside the cluster" is the test's side of the node: the job script runs in the node's network
namespace (where a user's machine on the node's network would be), not in a pod. It reaches
the control plane, the request tracker and MinIO at their Services' ClusterIPs through
kube-proxy's rules (a hosts file names them by the Services' DNS names, which the parts'
certificates carry: the script is tests/containers/faasd_job.py with ``--control-plane``,
``--tracker`` and ``--ca-file``), and uploads to the gateway pods' addresses the control plane
found through the headless Service ``fedfaas-node-gateway-peers`` (the pod network is routed to
the node, as on a flat pod network), verifying each gateway against the node name the control
plane gives with it (``tls_name``: core/server_names.py). No NodePort: the gateways are
addressed one by one (a client belongs to its node's gateway), which a Service's load
balancing would not do.

- TLS: plain HTTP to a gateway pod and to the control plane is answered 400 tls_required; a
  client certificate of another CA is refused; the request tracker's and the cache engine's
  certificates (the chart's own) get 403 client_certificate_required on a gateway's peer-partial
  route, where the control plane's certificate passes that check (``tls.internalNames``), and
  the control plane's rounds below go through those internal routes.

- 8 clients, 3 rounds, placed on both gateways; every round's model is float64 FedAvg of the
  uploads within 1e-6; the checkpoints in the chart's MinIO are the published models; Shapley
  (scored by digits-evaluator through the gateway), Multi-Krum and Oort through the tracker equal
  the same workloads run in process on the checkpointed objects; the cache engine created its
  flstore-cache functions through the gateway and faas-netes; both aggregator functions' pods
  ran slots.
- The control plane's own scale-up: jobs through the SDK, one update each on the first
  gateway, leave one more leaf waiting there than its aggregator endpoints (a leaf holds its
  endpoint until its second update): a shortage that lasts until the test sends the rest. The
  control plane scales ``aggregator`` through the gateway and faas-netes (the Deployment's
  replicas in the API server, its log's decision), the new pod's endpoints register in the
  gateway's router and take the waiting leaf; every round is then exact FedAvg and the new
  pod ran slots.
- A fault: the pod of the job's root gateway is deleted mid-round (half the clients' updates
  accepted) while the node is tainted, so the DaemonSet brings it back only once the control
  plane has declared the node dead (a pod back within the control plane's grace resumes
  from its journal instead: tests/control/test_node_grace.py). The other gateway adopts the
  job and the clients whose updates died with the root are asked to send them again; they do
  it as the SDK's clients do (their assignment's ``resend``), the pod comes back and rejoins,
  the other clients upload, and the round is the exact FedAvg of every client's update, each
  once.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.services import find_binary
from core.tls import mint_ca, mint_cert
from tests.containers.faasd_harness import job_result
from tests.containers.test_faasd_platform import _same
from tests.k8s import chart_tls
from tests.k8s.api import ApiError
from tests.k8s.chart_release import (
    IMAGES,
    NAMESPACE,
    RELEASE,
    TAG,
    get,
    install,
    pods_report,
    router_endpoints,
    secret,
)
from tests.k8s.faas_netes import (
    FUNCTION_NAMESPACE,
    OpenFaaSOnCluster,
    install_openfaas_objects,
    keep_imported_images,
    publish_gateway,
)
from tests.k8s.node import Node, pod_ready
from tests.k8s.node_fixture import started_node
from tests.k8s.sdk_job import NodeJob
from tests.openfaas.conftest import FaasCli, require_binary, wait_for

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
FUNCTION_IMAGES = [f"ghcr.io/fedfaas/flstore:{TAG}", f"ghcr.io/fedfaas/digits-evaluator:{TAG}"]
#: two gateways on the node, and requests a 2-core node can hold with a scale-up
VALUES = [
    "--set", "nodeGateway.perNode=2",
    "--set", "nodeGateway.resources.requests.cpu=100m",
    "--set", "nodeGateway.resources.requests.memory=256Mi",
    "--set", "aggregator.resources.requests.cpu=50m",
    "--set", "aggregator.resources.requests.memory=128Mi",
    "--set", "minio.resources.requests.cpu=50m",
    "--set", "minio.resources.requests.memory=256Mi",
    # a scale-up stays until the test has seen the new pod run slots (the default scales
    # down after 30 idle seconds)
    "--set", "controlPlane.env.FEDFAAS_CONTROL_SCALE_DOWN_S=600",
]  # fmt: skip
#: the Services the job script reaches by these names (tests/containers/faasd_job.py; MinIO
#: stays plain HTTP: the chart's TLS covers FedFaaS's own parts)
SERVICES = {
    "control-plane": f"{RELEASE}-control-plane",
    "request-tracker": f"{RELEASE}-request-tracker",
    "minio": f"{RELEASE}-minio",
}
GATEWAYS = (f"{RELEASE}-node-gateway", f"{RELEASE}-node-gateway-1")


def service_url(part: str, port: int) -> str:
    """A TLS part's URL by its Service's DNS name (the name its certificate carries)."""
    return f"https://{RELEASE}-{part}.{NAMESPACE}.svc:{port}"


@dataclass
class Platform:
    node: Node
    openfaas: OpenFaaSOnCluster
    secrets: Path
    #: the CA the chart generated (its parts' Secrets' ca.crt), the SDK's ca_file
    ca: Path

    def token(self, name: str) -> str:
        return (self.secrets / name).read_text().strip()

    def verify(self, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
        """A client context trusting the chart's CA (presenting ``cert`` where given)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key) if key else None)
        return ctx

    @property
    def control_plane(self) -> str:
        return service_url("control-plane", 8070)

    def job(self, name: str, clients: list[str], **options: Any) -> NodeJob:
        """A job through the SDK, from the node's network namespace, trusting the chart's CA."""
        admin = self.token("gateway-admin-secret")
        options.setdefault("ca_file", str(self.ca))
        return NodeJob(self.node.cluster.ns, self.control_plane, admin, name, clients, **options)

    def nodes(self) -> dict[str, dict[str, Any]]:
        """The control plane's nodes (``GET /v1/nodes``), by name."""
        url = f"{self.control_plane}/v1/nodes"
        r = get(self.node, url, self.token("analyst-token"), self.verify())
        assert r.status_code == 200, r.text
        return {n["name"]: n for n in r.json()["nodes"]}

    def gateway_node(self, daemonset: str) -> str:
        """The node name a gateway DaemonSet's pod serves (its certificate's name for it)."""
        return self.node.name if daemonset == GATEWAYS[0] else f"{self.node.name}-1"

    def endpoints(self, daemonset: str) -> list[dict[str, Any]]:
        """The aggregator endpoints registered with a gateway DaemonSet's pod, over https
        verified against the node it serves."""
        ip = self.gateway_pod(daemonset)["status"]["podIP"]
        admin = self.token("gateway-admin-secret")
        return router_endpoints(self.node, ip, admin, self.verify(), self.gateway_node(daemonset))

    def service_ip(self, name: str) -> str:
        svc = self.node.cluster.api.get("v1", "Service", name, NAMESPACE)
        assert svc is not None, name
        return str(svc["spec"]["clusterIP"])

    def gateway_pod(self, daemonset: str) -> dict[str, Any]:
        """The Ready, not terminating pod of one gateway DaemonSet."""
        pods = [
            p
            for p in self.node.cluster.api.list("v1", "Pod", NAMESPACE)
            if any(o["name"] == daemonset for o in p["metadata"].get("ownerReferences", []))
            and not p["metadata"].get("deletionTimestamp")
        ]
        assert len(pods) == 1 and pod_ready(pods[0]), [p.get("status") for p in pods]
        return pods[0]

    def function_pods(self, function: str) -> list[dict[str, Any]]:
        return self.node.cluster.api.list(
            "v1", "Pod", FUNCTION_NAMESPACE, selector=f"faas_function={function}"
        )

    def replica_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        """An aggregator pod's own status (``GET /`` with the function token)."""
        ip = pod["status"]["podIP"]
        r = get(self.node, f"http://{ip}:8080/", self.token("function-token"))
        assert r.status_code == 200, r.text
        return dict(r.json())


def _write_secrets(node: Node, folder: Path) -> Path:
    """The chart's Secrets as the files `fedfaas up` writes (faasd_job.py reads them)."""
    folder.mkdir(mode=0o700)
    tokens = f"{RELEASE}-tokens"
    files = {
        name: secret(node, tokens, name)
        for name in ("gateway-admin-secret", "analyst-token", "function-token")
    }
    files["minio-gateway.json"] = secret(node, f"{RELEASE}-minio-users", "minio-gateway.json")
    for name, value in files.items():
        path = folder / name
        path.touch(mode=0o600)
        path.write_text(value)
    return folder


def _deploy_evaluator(node: Node, of: OpenFaaSOnCluster, home: Path) -> None:
    cli = FaasCli(node.cluster.ns.wrapper("faas-cli", require_binary("faas-cli")), home)
    cli.gateway = of.url
    user, password = of.auth
    cli.ok("login", "--username", user, "--password-stdin", stdin=password)
    # the function token Secret is the chart's (fedfaas-function-token in openfaas-fn)
    cli.ok("deploy", "-f", "stack.yml", "--filter", "digits-evaluator", cwd=REPO)
    wait_for(
        lambda: bool(keep_imported_images(node.cluster.api)) or _ready(node, "digits-evaluator"),
        "faas-netes made the digits-evaluator Deployment",
        60,
    )
    wait_for(lambda: _ready(node, "digits-evaluator"), "digits-evaluator Ready", 180)


def _ready(node: Node, function: str) -> bool:
    pods = node.cluster.api.list(
        "v1", "Pod", FUNCTION_NAMESPACE, selector=f"faas_function={function}"
    )
    return bool(pods) and all(pod_ready(p) for p in pods)


@pytest.fixture(scope="module")
def platform(
    k8s_binaries: dict[str, Path],
    faas_netes_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Platform]:
    """The node with OpenFaaS, the chart (two gateways) and digits-evaluator."""
    folder = tmp_path_factory.mktemp("k8s-job")
    tools = () if find_binary("helm") else ("helm (`make helm`)",)
    images = [*IMAGES.values(), *FUNCTION_IMAGES]
    with started_node(k8s_binaries, folder, images, tools) as node:
        auth_dir = folder / "basic-auth"
        auth = install_openfaas_objects(node.cluster, auth_dir)
        of = OpenFaaSOnCluster(node.cluster, auth, auth_dir, folder / "openfaas")
        of.start(faas_netes_binary, require_binary("gateway"))
        publish_gateway(node.cluster)
        install(node, tmp_path_factory.mktemp("helm-home"), *VALUES)  # TLS: the default
        _deploy_evaluator(node, of, tmp_path_factory.mktemp("faas-cli-home"))
        secrets = _write_secrets(node, folder / "secrets")
        ca = secrets / "ca.crt"
        ca.write_text(secret(node, f"{RELEASE}-tls-control-plane", "ca.crt"))
        platform = Platform(node, of, secrets, ca)
        # the SDK's calls from this process reach the TLS parts by their Services' names
        with chart_tls.resolving(_service_names(platform)):
            yield platform


def _service_names(p: Platform) -> dict[str, str]:
    """The TLS parts' Service DNS names -> their ClusterIPs."""
    return {
        f"{svc}.{NAMESPACE}.svc": p.service_ip(svc)
        for svc in (f"{RELEASE}-{part}" for part in chart_tls.PARTS)
    }


def _run_job_script(p: Platform, tmp: Path, job: str) -> dict[str, Any]:
    """tests/containers/faasd_job.py in the node's network namespace, the Services' names in a
    hosts file of its own (a private mount namespace: nothing else sees it); function
    Deployments faas-netes makes meanwhile (the cache engine's) use the imported images."""
    hosts = tmp / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n"
        + "".join(f"{p.service_ip(svc)} {name}\n" for name, svc in SERVICES.items())
        + "".join(f"{ip} {name}\n" for name, ip in _service_names(p).items())
    )
    unshare = shutil.which("unshare")
    assert unshare is not None
    wrapper = p.node.cluster.ns.wrapper("unshare", unshare)
    script = (
        f"mount --bind {hosts} /etc/hosts && exec {sys.executable} "
        f"tests/containers/faasd_job.py --secrets {p.secrets} --job {job} "
        f"--clients 8 --rounds 3 --control-plane {p.control_plane} "
        f"--tracker {service_url('request-tracker', 8092)} --ca-file {p.ca}"
    )
    out, err = tmp / "job.out", tmp / "job.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(
            [str(wrapper), "--mount", "--propagation", "private", "sh", "-c", script],
            cwd=REPO,
            stdout=fo,
            stderr=fe,
            env={
                "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
                "PYTHONPATH": str(REPO),
                "HOME": str(tmp),
            },
        )
        try:
            failed: list[str] = []  # the API server's consecutive refusals of a patch round
            while True:
                try:
                    keep_imported_images(p.node.cluster.api)
                    failed.clear()
                except (ApiError, httpx.HTTPError) as exc:  # a loaded API server's 429/5xx
                    failed.append(str(exc)[:300])
                    assert len(failed) < 5, failed  # transient is a few; more is a fault
                try:
                    proc.wait(timeout=2)  # a patch round every 2 s while it runs
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out.read_text(errors="replace")
    assert proc.returncode == 0, (
        text[-3000:] + err.read_text(errors="replace")[-6000:] + pods_report(p.node)
    )
    return job_result(text)


def test_a_readme_job_runs_on_two_gateway_pods_and_flstore_answers_as_computed_here(
    platform: Platform, tmp_path: Path
) -> None:
    p = platform
    res = _run_job_script(p, tmp_path, "k8s-digits")
    (p.node.cluster.folder / "job.json").write_text(json.dumps(res, indent=1))  # for a reader
    gateway_urls = sorted(f"https://{p.gateway_pod(d)['status']['podIP']}:8081" for d in GATEWAYS)
    rounds = res["job"]["rounds"]
    assert [r["version"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        assert r["rel_error"] <= 1e-6, r
        assert r["gateways"] == gateway_urls, r  # clients on both gateway pods
        assert res["here"]["global_sha"][str(r["round"])] == r["global_sha"], r
    for workload in res["asked"]:
        _same(res["tracker"][workload]["result"], res["here"][workload], workload)
    shapley = res["tracker"]["shapley"]["result"]["values"]
    assert set(shapley) == set(res["job"]["clients"]) and any(shapley.values())
    # the cache engine made its functions through the gateway and faas-netes: Deployments of
    # the flstore image in the function namespace
    caches = [
        d
        for d in p.node.cluster.api.list("apps/v1", "Deployment", FUNCTION_NAMESPACE)
        if d["metadata"]["name"].startswith("flstore-cache-")
    ]
    assert len(caches) >= 2, [d["metadata"]["name"] for d in caches]  # primary and secondary
    assert {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in caches} == {
        FUNCTION_IMAGES[0]
    }
    # each gateway's aggregator function ran slots, in endpoints registered with that gateway
    for daemonset, function in zip(GATEWAYS, ("aggregator", "aggregator-1"), strict=True):
        registered = {e["id"] for e in p.endpoints(daemonset)}
        # (a pod the function's autoscaling is still starting or stopping has no replica to ask)
        pods = [pod for pod in _live(p.function_pods(function)) if pod_ready(pod)]
        statuses = [p.replica_status(pod) for pod in pods]
        assert sum(e["tasks_done"] for s in statuses for e in s["endpoints"]) > 0, statuses
        for s in statuses:
            assert {e["endpoint"] for e in s["endpoints"]} <= registered, (s, registered)


def _post_partial(p: Platform, gateway_ip: str, ctx: ssl.SSLContext) -> httpx.Response:
    """A peer partial (an internal route: gateway/callers.py) of a job no gateway has, with
    the admin secret, to the first gateway pod over TLS (``ctx``'s client certificate)."""
    url = f"https://{gateway_ip}:8081/v1/internal/jobs/no-such-job/rounds/1/partials?slot=1"
    headers = {"Authorization": f"Bearer {p.token('gateway-admin-secret')}"}

    def call() -> httpx.Response:
        with httpx.Client(verify=ctx, timeout=10) as client:
            return client.post(
                url, headers=headers, content=b"", extensions={"sni_hostname": p.node.name}
            )

    return p.node.cluster.ns.call(call)


def test_the_default_tls_refuses_plain_http_another_ca_and_the_engines_certificate_inside(
    platform: Platform, tmp_path: Path
) -> None:
    p = platform
    gateway_ip = p.gateway_pod(GATEWAYS[0])["status"]["podIP"]
    control_plane_ip = p.service_ip(SERVICES["control-plane"])
    for url in (f"http://{gateway_ip}:8081/healthz", f"http://{control_plane_ip}:8070/healthz"):
        r = p.node.cluster.ns.call(httpx.get, url, timeout=10)
        assert r.status_code == 400 and r.json()["error"] == "tls_required", (url, r.text)
    healthz = f"https://{gateway_ip}:8081/healthz"
    # the SDK's kind, no client certificate, verified by the node's name: let in
    assert get(p.node, healthz, "", p.verify(), p.node.name).json()["node"] == p.node.name
    # a client certificate of another CA: refused (TLS 1.3: at the first read)
    other = mint_ca(tmp_path / "other-ca", name="another CA")
    stranger = mint_cert(other, tmp_path / "other-ca", "stranger", ["stranger"])
    with pytest.raises(httpx.TransportError):
        get(p.node, healthz, "", p.verify(stranger.cert, stranger.key), p.node.name)
    # the chart's own certificates on a gateway's internal route (tls.internalNames)
    answers = {}
    for part in ("request-tracker", "cache-engine", "control-plane"):
        cert, key = tmp_path / f"{part}.crt", tmp_path / f"{part}.key"
        cert.write_text(secret(p.node, f"{RELEASE}-tls-{part}", "tls.crt"))
        key.touch(mode=0o600)
        key.write_text(secret(p.node, f"{RELEASE}-tls-{part}", "tls.key"))
        r = _post_partial(p, gateway_ip, p.verify(cert, key))
        answers[part] = (r.status_code, r.json()["error"])
    assert answers == {
        "request-tracker": (403, "client_certificate_required"),
        "cache-engine": (403, "client_certificate_required"),
        "control-plane": (404, "unknown_job"),  # past the certificate's check
    }, answers


# ---------------------------------------------------------------------------------------------
def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _control_plane_log(p: Platform) -> str:
    (pod,) = [
        pod
        for pod in p.node.cluster.api.list("v1", "Pod", NAMESPACE)
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") == "control-plane"
    ]
    return p.node.pod_log(NAMESPACE, pod["metadata"]["name"], tail=10**8)


def test_the_control_plane_scales_the_aggregator_for_waiting_leaves_and_the_new_pod_runs_them(
    platform: Platform,
) -> None:
    p = platform
    api = p.node.cluster.api
    endpoints = p.endpoints(GATEWAYS[0])
    before = {pod["metadata"]["name"] for pod in _live(p.function_pods("aggregator"))}
    dep = api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
    assert dep is not None
    replicas = dep["spec"]["replicas"]
    assert len(before) == replicas and len(endpoints) >= 1, (before, endpoints)
    # one job more than the first gateway has endpoints, each with one update there: every
    # endpoint holds a leaf waiting for its second update, and one leaf waits for an endpoint
    jobs = []
    for j in range(len(endpoints) + 1):
        job = p.job(f"k8s-scale-{j}", [f"s{j}-{i}" for i in range(8)])
        on_first = [c for c in job.clients if job.assignment(c).node == p.node.name]
        assert len(on_first) >= 2, {c: job.assignment(c).node for c in job.clients}
        job.upload(on_first[0], seed=100 * j)
        jobs.append(job)

    def scaled() -> bool:
        dep = api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
        return dep is not None and dep["spec"]["replicas"] > replicas

    wait_for(scaled, "the control plane scaled aggregator (its Deployment's replicas)", 180)

    def scale_ups() -> list[re.Match[str]]:  # the decision, logged once the scale call returned
        pattern = r"aggregator: (\d+) -> (\d+) replicas \(short of \{([^}]*)\}"
        return [m for m in re.finditer(pattern, _control_plane_log(p)) if int(m[2]) > int(m[1])]

    wait_for(lambda: bool(scale_ups()), "the control plane's scale-up in its log", 60)
    up = scale_ups()[-1]
    assert int(up[1]) == replicas, up[0]
    assert f"'{p.node.name}'" in up[3], up[0]  # the first gateway was short

    def new_pods() -> list[dict[str, Any]]:
        return [
            pod
            for pod in _live(p.function_pods("aggregator"))
            if pod["metadata"]["name"] not in before and pod_ready(pod)
        ]

    wait_for(lambda: bool(new_pods()), "a new aggregator pod Ready", 240)
    keep = {e["id"] for e in endpoints}

    def registered() -> set[str]:
        ids = {e["id"] for e in p.endpoints(GATEWAYS[0])}
        mine = {e["endpoint"] for pod in new_pods() for e in p.replica_status(pod)["endpoints"]}
        return mine if mine and mine <= ids and not mine & keep else set()

    wait_for(
        lambda: bool(registered()), "the new pod's endpoints in the first gateway's router", 180
    )
    for j, job in enumerate(jobs):
        for i, c in enumerate(c for c in job.clients if c not in job.sent):
            job.upload(c, seed=100 * j + 1 + i)
    errors = []
    for job in jobs:
        h = job.wait()
        assert h["aggregated"] == 8 and h["lost"] == 0, h
        errors.append(job.assert_fedavg())
    done = {
        pod["metadata"]["name"]: sum(e["tasks_done"] for e in p.replica_status(pod)["endpoints"])
        for pod in new_pods()
    }
    assert any(n > 0 for n in done.values()), done
    log.info("scale-up: %s; the new pods' slots %s; FedAvg relative errors %s", up[0], done, errors)


def test_a_root_gateway_pod_deleted_mid_round_comes_back_and_the_resent_round_is_exact(
    platform: Platform,
) -> None:
    p = platform
    api = p.node.cluster.api
    job = p.job("k8s-fault", [f"f{i}" for i in range(8)])
    placed = {c: job.assignment(c).node for c in job.clients}
    root = job.view()["root"]
    on_root = [c for c in job.clients if placed[c] == root]
    others = [c for c in job.clients if placed[c] != root]
    assert len(on_root) >= 2 and len(others) >= 2, placed
    for i, c in enumerate([*on_root[:2], *others[:2]]):  # half the updates accepted
        job.upload(c, seed=300 + i)
    url = p.nodes()[root]["url"]
    (victim,) = [
        pod for d in GATEWAYS if f"//{(pod := p.gateway_pod(d))['status']['podIP']}:" in url
    ]
    daemonset = next(o["name"] for o in victim["metadata"]["ownerReferences"])
    hold = {"key": "fedfaas.test/hold", "value": "gateway", "effect": "NoSchedule"}
    api.patch("v1", "Node", p.node.name, None, {"spec": {"taints": [hold]}})
    try:
        assert api.delete("v1", "Pod", victim["metadata"]["name"], NAMESPACE)

        def taken_over() -> bool:
            view = job.view()
            return bool(view["root"] != root and view["round"]["takeovers"] >= 1)

        wait_for(taken_over, f"the control plane failing job k8s-fault over from {root}", 120)
    finally:
        api.patch("v1", "Node", p.node.name, None, {"spec": {"taints": None}})
    view = job.view()
    assert view["round"]["number"] == 1 and view["round"]["state"] == "open", view["round"]
    asked = view["round"]["resend"]
    assert set(asked) == set(on_root[:2]), asked  # the updates that died with the root

    def back() -> bool:
        try:
            pod = p.gateway_pod(daemonset)
        except AssertionError:
            return False
        return bool(pod["metadata"]["name"] != victim["metadata"]["name"])

    wait_for(back, "the DaemonSet's new gateway pod Ready", 240)
    new_ip = p.gateway_pod(daemonset)["status"]["podIP"]

    def rejoined() -> bool:  # found again through the headless Service, healthy
        node = p.nodes().get(root) or {}
        return f"//{new_ip}:" in str(node.get("url")) and bool(node.get("healthy"))

    wait_for(rejoined, f"the control plane sees {root}'s new pod healthy", 120)
    for c in asked:  # as the SDK's clients do: their assignment's resend grew
        a = job.send_again(c)
        assert a.node != root and a.resend == asked[c], a
    for i, c in enumerate(c for c in job.clients if c not in job.sent):
        job.upload(c, seed=400 + i)
    h = job.wait()
    assert h["state"] == "closed" and h["aggregated"] == 8 and h["lost"] == 0, h
    log.info(
        "root %s's pod deleted; %s took the job over; sent again: %s; FedAvg relative error %.2g",
        root,
        view["root"],
        asked,
        job.assert_fedavg(),
    )

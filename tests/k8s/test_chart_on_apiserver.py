"""The chart against a real Kubernetes API server (kube-apiserver and kube-controller-manager
v1.34 built from the Go module proxy, Debian's etcd), in a private namespace
(:mod:`tests.k8s.cluster`). No kubelet and no scheduler run: pods are created, never started.

- ``helm install`` with the defaults, with eBPF on and with basic auth off: every object of the
  release is accepted and stored (server-side validation and admission: RBAC, NetworkPolicy,
  Secrets, projected volumes, probes, the privileged eBPF container). Every rendered object also
  passes the server's strict validation first (a plain create only warns about an unknown field
  and drops it; helm then succeeds), and helm gets no warning from the server. Helm's hook,
  the MinIO provisioning Job, would make ``helm install`` wait for the Job to complete, which
  needs a kubelet: the release is installed with ``--no-hooks`` and the hook objects (``helm
  get hooks``) are then created through the API, so they are accepted too; none of them runs.
- The controller manager makes every workload's pods: each Deployment's ReplicaSet and its
  Pods, the StatefulSets' Pods, the DaemonSet's Pod on the Node registered by hand, the hook
  Job's Pod. All stay Pending (no scheduler binds them, no kubelet runs them).
- The defaults serve TLS from certificates the chart makes (a CA in the Secret
  ``fedfaas-tls-ca``, kept like the other generated Secrets, and each part's certificate,
  the gateways' naming the Node registered here); with TLS off (``tls.enabled=false``) and
  with TLS from an operator's Secrets (``tls.secretName``) the same; with cert-manager
  (``tls.certManager.issuerRef``) the install is refused, saying why, while the API server
  serves no ``cert-manager.io/v1``; once cert-manager's own CRDs are created
  (scripts/cert-manager-crds.sh, from the Go module proxy) the chart makes a ``Certificate``
  for each TLS part, which passes the CRD's strict schema and is stored, writing the Secret
  the part's pods mount, for the names of its Service (the gateway's: the Node's name too).
  No cert-manager controller runs: nothing issues them here.
- ``helm uninstall`` removes the release and keeps the Secrets the chart marks
  ``helm.sh/resource-policy: keep``; a new install takes them back unchanged.
- faas-netes (OpenFaaS's Kubernetes provider, with the RBAC OpenFaaS gives it) lists the
  chart's ``aggregator`` Deployment as a function; the real gateway in front of it:
  ``faas-cli list``/``describe`` and ``POST /system/scale-function/aggregator`` change the
  Deployment's ``spec.replicas`` in the API server, and so does the control plane's autoscaler
  (its provider client, built from its settings as the service builds it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from control_plane.api import _build
from control_plane.settings import ControlPlaneSettings
from tests.k8s.api import ApiError, conditions
from tests.k8s.chart_tls import PARTS as TLS_PARTS
from tests.k8s.cluster import Cluster
from tests.k8s.conftest import NODE, Helm
from tests.k8s.faas_netes import FUNCTION_NAMESPACE, OpenFaaSOnCluster
from tests.openfaas.conftest import FaasCli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHART = Path(__file__).resolve().parents[2] / "charts" / "fedfaas"
RELEASE, NAMESPACE = "fedfaas", "openfaas"
VALUE_SETS = {
    "defaults": [],
    "ebpf": ["--set", "nodeGateway.ebpf.enabled=true"],
    "no-basic-auth": ["--set", "basicAuth=false"],
    # TLS from Secrets the operator makes (none here: the pods are never started)
    "tls": ["--set", "tls.secretName=ops-tls"],
    "no-tls": ["--set", "tls.enabled=false"],
}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
#: the kinds every value set renders (a kind missing from the release is a chart change)
KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "Deployment",
    "NetworkPolicy",
    "Role",
    "RoleBinding",
    "Secret",
    "Service",
    "ServiceAccount",
    "StatefulSet",
}


def _docs(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


def _namespace(obj: dict[str, Any]) -> str:
    """The object's namespace (the release's where it names none; ignored where the kind is
    cluster-scoped)."""
    return str(obj["metadata"].get("namespace") or NAMESPACE)


def _owned_by(objs: list[dict[str, Any]], owner: dict[str, Any]) -> list[dict[str, Any]]:
    uid = owner["metadata"]["uid"]
    return [
        o for o in objs if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences", []))
    ]


def _pods_of(cluster: Cluster, workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The Pods the controllers made for ``workload`` (through its ReplicaSets for a
    Deployment)."""
    api, ns = cluster.api, workload["metadata"]["namespace"]
    pods = api.list("v1", "Pod", ns)
    if workload["kind"] != "Deployment":
        return _owned_by(pods, workload)
    sets = _owned_by(api.list("apps/v1", "ReplicaSet", ns), workload)
    return [p for rs in sets for p in _owned_by(pods, rs)]


def _want_pods(cluster: Cluster, workload: dict[str, Any]) -> int:
    kind = workload["kind"]
    if kind == "DaemonSet":
        return len(cluster.api.list("v1", "Node"))
    if kind == "Job":
        return 1
    return int(workload["spec"].get("replicas", 1))


def _warnings(cluster: Cluster) -> list[str]:
    """The Warning events of the release's namespaces (why a controller made no pod)."""
    return [
        f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['message']}"
        for ns in (NAMESPACE, FUNCTION_NAMESPACE)
        for e in cluster.api.list("v1", "Event", ns)
        if e.get("type") == "Warning"
    ]


def _kept_secrets(cluster: Cluster, objs: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """The data of the release's Secrets marked ``helm.sh/resource-policy: keep``, as stored
    (None where the server has none)."""
    out: dict[tuple[str, str], Any] = {}
    for o in objs:
        annotations = o["metadata"].get("annotations") or {}
        if o["kind"] == "Secret" and annotations.get("helm.sh/resource-policy") == "keep":
            ns, name = _namespace(o), o["metadata"]["name"]
            stored = cluster.api.get("v1", "Secret", name, ns)
            out[(ns, name)] = None if stored is None else stored["data"]
    return out


def _install(helm: Helm, *values: str) -> list[dict[str, Any]]:
    """``helm install --no-hooks`` of the chart; the objects of the release (its manifest)."""
    res = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--no-hooks", *values)
    assert res.returncode == 0, res.stderr
    # the API server's warnings (a deprecated API or field, a dropped unknown field), which
    # helm prints on stderr
    assert "warning" not in res.stderr.lower(), res.stderr
    return _docs(helm.ok("get", "manifest", RELEASE, "--namespace", NAMESPACE))


def _uninstall(cluster: Cluster, helm: Helm, hooks: list[dict[str, Any]]) -> None:
    helm.ok("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
    for h in hooks:  # the hook objects were created by hand: helm does not remove them
        cluster.api.delete(h["apiVersion"], h["kind"], h["metadata"]["name"], _namespace(h))
    wait_for(
        lambda: (
            not cluster.api.list("v1", "Pod", NAMESPACE)
            and not cluster.api.list("v1", "Pod", FUNCTION_NAMESPACE)
        ),
        "every pod of the release deleted",
        120,
    )


@pytest.mark.parametrize("values", list(VALUE_SETS))
def test_every_object_of_the_chart_is_accepted_and_its_controllers_make_the_pods(
    cluster: Cluster, helm: Helm, values: str
) -> None:
    rendered = _docs(
        helm.ok("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[values])
    )
    kept_before = _kept_secrets(cluster, rendered)
    for o in rendered:  # hooks included; an unknown field is an error here, not a warning
        cluster.api.validate(o)
    objs = _install(helm, *VALUE_SETS[values])
    hooks = _docs(helm.ok("get", "hooks", RELEASE, "--namespace", NAMESPACE))
    try:
        assert {o["kind"] for o in objs} == KINDS
        assert [(h["kind"], h["metadata"]["annotations"]["helm.sh/hook"]) for h in hooks] == [
            ("Job", "post-install,post-upgrade")
        ]
        for h in hooks:
            cluster.api.create(h)
        stored = {}
        for o in [*objs, *hooks]:
            key = (o["kind"], _namespace(o), o["metadata"]["name"])
            got = cluster.api.get(o["apiVersion"], o["kind"], key[2], key[1])
            assert got is not None and got["metadata"]["uid"], f"{key} not stored"
            stored[key] = got
        # a Secret the chart keeps across installs is taken back as it was (helm's lookup)
        for secret, data in _kept_secrets(cluster, objs).items():
            assert data is not None, f"{secret} not stored"
            if kept_before.get(secret) is not None:
                assert data == kept_before[secret], f"{secret} changed on a new install"

        gateway = stored[("DaemonSet", NAMESPACE, f"{RELEASE}-node-gateway")]
        container = gateway["spec"]["template"]["spec"]["containers"][0]
        assert container["securityContext"].get("privileged", False) is (values == "ebpf")
        control = stored[("Deployment", NAMESPACE, f"{RELEASE}-control-plane")]
        env = {e["name"] for e in control["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert ("FEDFAAS_CONTROL_PROVIDER_AUTH_DIR" in env) is (values != "no-basic-auth")
        args = control["spec"]["template"]["spec"]["containers"][0]["args"]
        assert ("--tls-cert-file" in args) is (values != "no-tls")
        made = {
            o["metadata"]["name"]
            for o in objs
            if o["kind"] == "Secret" and "-tls-" in o["metadata"]["name"]
        }
        if values in ("tls", "no-tls"):  # the operator's Secrets, or none
            assert made == set(), made
        else:  # the chart's own: the CA and each part's, the gateways' naming the Node
            assert made == {f"{RELEASE}-tls-{p}" for p in ("ca", *TLS_PARTS)}, made
            cert = base64.b64decode(
                stored[("Secret", NAMESPACE, f"{RELEASE}-tls-node-gateway")]["data"]["tls.crt"]
            )
            names = (
                x509.load_pem_x509_certificate(cert)
                .extensions.get_extension_for_class(x509.SubjectAlternativeName)
                .value.get_values_for_type(x509.DNSName)
            )
            assert NODE in names, names

        workloads = [stored[k] for k in stored if k[0] in WORKLOADS]
        assert {w["kind"] for w in workloads} == set(WORKLOADS)

        def pods_made() -> bool:
            return all(len(_pods_of(cluster, w)) == _want_pods(cluster, w) for w in workloads)

        try:
            wait_for(pods_made, "the controllers made every workload's pods", 120)
        except AssertionError as exc:
            counts = {
                f"{w['kind']}/{w['metadata']['name']}": (
                    len(_pods_of(cluster, w)),
                    _want_pods(cluster, w),
                )
                for w in workloads
            }
            raise AssertionError(f"{exc}: (made, wanted) {counts}; {_warnings(cluster)}") from None
        for w in workloads:
            for pod in _pods_of(cluster, w):
                assert pod["status"]["phase"] == "Pending", pod["status"]
                assert not pod["spec"].get("nodeName"), "bound without a scheduler?"
                if w["kind"] == "DaemonSet":  # the controller aims it at the Node by name
                    terms = pod["spec"]["affinity"]["nodeAffinity"][
                        "requiredDuringSchedulingIgnoredDuringExecution"
                    ]["nodeSelectorTerms"]
                    assert terms[0]["matchFields"][0]["values"] == [NODE]
    finally:
        _uninstall(cluster, helm, hooks)
    for secret, data in _kept_secrets(cluster, objs).items():
        assert data is not None, f"{secret} was deleted on uninstall; the chart keeps it"
    left = [
        o["metadata"]["name"]
        for o in objs
        if o["kind"] != "Secret"
        and cluster.api.get(o["apiVersion"], o["kind"], o["metadata"]["name"], _namespace(o))
    ]
    assert left == [], f"left after uninstall: {left}"


def _replicas(cluster: Cluster) -> int:
    d = cluster.api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
    assert d is not None
    return int(d["spec"]["replicas"])


def _settled(cluster: Cluster) -> bool:
    """The deployment controller has observed the aggregator's last change and counted its
    replicas (it writes nothing more until the next change)."""
    d = cluster.api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
    assert d is not None
    status = d.get("status") or {}
    observed = status.get("observedGeneration") == d["metadata"].get("generation")
    return observed and status.get("replicas") == int(d["spec"]["replicas"])


def _provider_replicas(openfaas: OpenFaaSOnCluster) -> int | None:
    """The aggregator's replicas as the gateway reports them (faas-netes' informer cache);
    None while the gateway answers otherwise than 200 (a wait polls on through a passing 5xx)."""
    r = openfaas.http("GET", "/system/function/aggregator")
    return int(r.json()["replicas"]) if r.status_code == 200 else None


def _describe(faas_cli: FaasCli) -> dict[str, str]:
    out = faas_cli.ok("describe", "aggregator")
    return {k.strip(): v.strip() for k, v in re.findall(r"^([^:\n]+):[ \t]*(.*)$", out, re.M)}


def _autoscale(openfaas: OpenFaaSOnCluster, function: str, load: dict[str, Any]) -> Any:
    """One autoscaling step of the control plane: its coordinator and provider client built
    from its settings (``_build``, as ``python -m control_plane`` builds them; the settings
    are the chart's, the gateway reached at its address inside the namespace), then
    ``autoscale`` with one node gateway's ``/healthz`` aggregator report."""
    settings = ControlPlaneSettings(
        provider_url=openfaas.url,
        provider_auth_dir=openfaas.auth_dir,
        function=function,
        gateways_service=f"{RELEASE}-node-gateway-peers.{NAMESPACE}.svc:8081",
        scale_down_s=0,
    )

    async def step() -> tuple[int | None, str | None]:
        coordinator = _build(settings)
        try:
            await coordinator.autoscale({NODE: {"aggregators": load}})
            return coordinator.last_scale, coordinator.scale_error
        finally:
            await coordinator.stop()

    return openfaas.cluster.ns.call(asyncio.run, step())


def test_faas_netes_and_the_gateway_scale_the_charts_aggregator(
    cluster: Cluster, helm: Helm, openfaas: OpenFaaSOnCluster, faas_cli: FaasCli
) -> None:
    _install(helm)
    try:
        # faas-netes lists the chart's Deployment (label faas_function) as a function
        wait_for(lambda: "aggregator" in faas_cli.ok("list"), "faas-cli list shows it", 60)
        row = [line.split() for line in faas_cli.ok("list").splitlines()[1:]]
        assert ["aggregator", "0", "1"] in row  # name, invocations, replicas
        info = _describe(faas_cli)
        assert info["Name"] == "aggregator" and info["Replicas"] == "1"
        assert info["Available Replicas"] == "0"  # Pending: no kubelet
        assert info["Image"].startswith("ghcr.io/fedfaas/aggregator:")

        # the gateway's scale call (its credentials required) changes the Deployment
        no_auth = openfaas.http(
            "POST", "/system/scale-function/aggregator", auth=None, json={"replicas": 3}
        )
        assert no_auth.status_code == 401 and _replicas(cluster) == 1
        # faas-netes reads, then updates the Deployment with no retry on a conflict: a scale
        # waits until the controller has written the status of the Deployment's last change
        # (a 500 "unable to update function deployment" once under CI when it did not; here
        # the change is the install itself)
        wait_for(lambda: _settled(cluster), "the Deployment's status is written", 60)
        r = openfaas.http(
            "POST",
            "/system/scale-function/aggregator",
            json={"serviceName": "aggregator", "replicas": 3},
        )
        assert r.status_code in (200, 202), r.text
        assert _replicas(cluster) == 3
        wait_for(lambda: _describe(faas_cli)["Replicas"] == "3", "describe shows 3", 30)
        deployment = cluster.api.get("apps/v1", "Deployment", "aggregator", FUNCTION_NAMESPACE)
        assert deployment is not None
        wait_for(lambda: len(_pods_of(cluster, deployment)) == 3, "the controllers made 3 pods", 60)
        # the next scale waits for this one's status, as the first waited for the install's
        wait_for(lambda: _settled(cluster), "the Deployment's status is written", 60)

        # OpenFaaS CE's faas-netes caps a function at 5 replicas (MaxReplicas): asked for 8
        # through the gateway, the Deployment gets 5
        r = openfaas.http("POST", "/system/scale-function/aggregator", json={"replicas": 8})
        assert r.status_code in (200, 202), r.text
        assert _replicas(cluster) == 5
        wait_for(lambda: _provider_replicas(openfaas) == 5, "faas-netes sees 5 replicas", 30)

        # the control plane's autoscaler through the gateway: down to the function's minimum
        # (1) once every node is idle
        idle = {"endpoints": 2, "free_endpoints": 2, "waiting_slots": 0, "queue": 0}
        assert _autoscale(openfaas, "aggregator", idle) == (1, None)
        assert _replicas(cluster) == 1
        wait_for(lambda: _provider_replicas(openfaas) == 1, "faas-netes sees 1 replica", 30)
        # a node short of endpoints while the replica asked for is not available (Pending: no
        # kubelet) asks for nothing more until it is: the provider's availableReplicas is the
        # Deployment's status
        busy = {"endpoints": 0, "free_endpoints": 0, "waiting_slots": 4, "queue": 0}
        assert _autoscale(openfaas, "aggregator", busy) == (1, None)
        assert _replicas(cluster) == 1
        # a function the provider does not have: a clear error, nothing scaled
        last, error = _autoscale(openfaas, "no-such-function", busy)
        assert last is None and "no-such-function" in error and "not deployed" in error
        assert _replicas(cluster) == 1
    finally:
        _uninstall(cluster, helm, [])
    wait_for(lambda: "aggregator" not in faas_cli.ok("list"), "faas-cli list forgets it", 60)


def test_the_strict_check_refuses_an_unknown_field(cluster: Cluster, helm: Helm) -> None:
    """The check above is not vacuous: a field the server does not know is an error, named."""
    rendered = _docs(helm.ok("template", RELEASE, str(CHART), "--namespace", NAMESPACE))
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(ApiError, match=r"imagePullPolicyy: field not declared in schema"):
        cluster.api.validate(deployment)
    assert (
        cluster.api.get("apps/v1", "Deployment", deployment["metadata"]["name"], NAMESPACE) is None
    )


def _cert_manager_crds() -> list[dict[str, Any]]:
    """cert-manager's CRDs (scripts/cert-manager-crds.sh: fetched from the Go module proxy
    into the cache once, as the Kubernetes binaries are)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "cert-manager-crds.sh"
    res = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0, res.stderr
    folder = Path(res.stdout.strip().splitlines()[-1])
    return [d for f in sorted(folder.glob("*.yaml")) for d in _docs(f.read_text())]


def _established(cluster: Cluster, name: str) -> bool:
    crd = cluster.api.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    return conditions(crd).get("Established") == "True"


def _discovered(cluster: Cluster, group_version: str) -> bool:
    """The API server's discovery (``GET /apis``, what helm reads) lists ``group_version``."""
    r = cluster.api.request("GET", "/apis")
    if r.status_code != 200:
        return False
    return any(
        v["groupVersion"] == group_version for g in r.json()["groups"] for v in g["versions"]
    )


def test_with_cert_manager_the_chart_makes_a_certificate_for_each_tls_part(
    cluster: Cluster, helm: Helm
) -> None:
    values = ["--set", "tls.enabled=true", "--set", "tls.certManager.issuerRef.name=fedfaas-ca"]
    refused = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--no-hooks", *values)
    assert refused.returncode != 0, refused.stdout
    assert "does not serve cert-manager.io/v1" in refused.stderr, refused.stderr
    crds = _cert_manager_crds()
    for crd in crds:
        cluster.api.create(crd)
    names = [crd["metadata"]["name"] for crd in crds]
    try:
        wait_for(lambda: all(_established(cluster, n) for n in names), "the CRDs established", 60)
        # helm asks the server's discovery, which lists a CRD's group a moment after the CRD is
        # Established (the discovery controller adds it on its own)
        wait_for(lambda: _discovered(cluster, "cert-manager.io/v1"), "cert-manager.io/v1", 60)
        objs = _install(helm, *values)
        try:
            certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
            parts = ("node-gateway", "control-plane", "cache-engine", "request-tracker")
            assert set(certs) == {f"{RELEASE}-tls-{p}" for p in parts}, set(certs)
            for name, cert in certs.items():
                cluster.api.validate(cert)  # cert-manager's schema, strictly
                got = cluster.api.get("cert-manager.io/v1", "Certificate", name, NAMESPACE)
                assert got is not None and got["spec"]["secretName"] == name, got
                assert got["spec"]["issuerRef"]["name"] == "fedfaas-ca", got
            gateway = certs[f"{RELEASE}-tls-node-gateway"]["spec"]["dnsNames"]
            assert NODE in gateway, gateway  # the Node the API server lists (helm's lookup)
            assert f"{RELEASE}-node-gateway-peers.{NAMESPACE}.svc" in gateway, gateway
            engine = certs[f"{RELEASE}-tls-cache-engine"]["spec"]["dnsNames"]
            assert f"{RELEASE}-cache-engine.{NAMESPACE}" in engine, engine  # its callers' URL
            # each part's pods mount the Secret its Certificate writes
            for kind, part in (("DaemonSet", "node-gateway"), ("Deployment", "cache-engine")):
                workload = next(
                    o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(part)
                )
                volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
                assert volumes["tls-secret"]["secret"]["secretName"] == f"{RELEASE}-tls-{part}"
            # the check is not vacuous: a field cert-manager's schema lacks is refused
            bad = json.loads(json.dumps(certs[f"{RELEASE}-tls-cache-engine"]))
            bad["spec"]["dnsNamez"] = ["x"]
            with pytest.raises(ApiError, match=r"dnsNamez"):
                cluster.api.validate(bad)
        finally:
            _uninstall(cluster, helm, [])
    finally:
        for name in names:
            cluster.api.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)

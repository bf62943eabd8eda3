"""What the Kubernetes path needs of the rendered chart, read from ``helm template`` (no cluster
here): the node gateway and the aggregator share a uid (store objects and the router socket are
the gateway's own), the node folders are handed to that uid, the checkpoint spool is on the node,
the gateways and the control plane find the gateways through the headless Service, every Secret
and ConfigMap a pod references is rendered (or is OpenFaaS's own), faas-netes sees the aggregator
as a function, and the NetworkPolicy admits the cache functions to MinIO."""

from __future__ import annotations

from typing import Any

import pytest

from tests.platform.test_chart import _pod_specs, _render, needs_helm

pytestmark = needs_helm

GATEWAY = "DaemonSet/rel-fedfaas-node-gateway"
AGGREGATOR = "Deployment/aggregator"
#: Secrets the chart uses but does not make: OpenFaaS's chart makes `basic-auth` in `openfaas`
EXTERNAL_SECRETS = {("openfaas", "basic-auth")}
EBPF = {"off": (), "on": ("nodeGateway.ebpf.enabled=true",)}


def _doc(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _uid(pod: dict[str, Any], container: dict[str, Any]) -> int | None:
    """The uid a container runs as (its own securityContext, else the pod's; None: the
    image's USER)."""
    for ctx in (container.get("securityContext") or {}, pod.get("securityContext") or {}):
        if "runAsUser" in ctx:
            return int(ctx["runAsUser"])
    return None


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _mount_of(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mounted at the longest mount path that holds ``path``."""
    mounts = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"nothing is mounted at {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return next(v for v in pod["volumes"] if v["name"] == mount["name"])


@pytest.mark.parametrize("ebpf", EBPF)
def test_gateway_and_aggregator_run_as_one_uid_and_the_node_folders_are_theirs(
    ebpf: str,
) -> None:
    specs = _pod_specs(_render(*EBPF[ebpf]))
    gw_pod, agg_pod = specs[GATEWAY], specs[AGGREGATOR]
    gw, agg = gw_pod["containers"][0], agg_pod["containers"][0]
    uid = _uid(gw_pod, gw)
    assert uid is not None, "the gateway's uid would be whatever its image says"
    assert _uid(agg_pod, agg) == uid
    assert uid == (0 if ebpf == "on" else 12000)
    assert agg["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agg["securityContext"]["allowPrivilegeEscalation"] is False
    assert bool(agg["securityContext"].get("runAsNonRoot")) == (uid != 0)
    # both see the same host folders for the store and the socket
    for path in ("/dev/shm/fedfaas", "/run/fedfaas"):
        assert _mount_of(gw_pod, gw, path)["hostPath"] == _mount_of(agg_pod, agg, path)["hostPath"]
    host_folders = {m["mountPath"] for m in gw["volumeMounts"]} & {
        "/dev/shm/fedfaas",
        "/run/fedfaas",
        "/var/lib/fedfaas/gateway",
    }
    assert len(host_folders) == 3
    # (the TLS files' copy, on by default, is tests/k8s/test_chart_tls_render's)
    inits = [c for c in gw_pod.get("initContainers", []) if c["name"] != "tls-files"]
    # kubelet makes hostPath folders root-owned 0755, and an earlier gateway of the other uid
    # (eBPF turned on or off) leaves its store: an init container hands them over, recursively
    # (its command run: tests/platform/test_chart.py)
    (init,) = inits
    assert init["command"][:4] == ["chown", "-R", "-h", f"{uid}:{uid}"]
    assert set(init["command"][4:]) == host_folders
    for path in host_folders:
        assert _mount_of(gw_pod, init, path) == _mount_of(gw_pod, gw, path)
    ctx = init["securityContext"]
    assert ctx["runAsUser"] == 0
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_READ_SEARCH"]}
    assert ctx["allowPrivilegeEscalation"] is False


def test_checkpoint_spool_is_on_the_node_and_outlives_the_pod() -> None:
    """The gateway spools checkpoints under its state folder (``checkpoint-spool-<node>``):
    that folder is a hostPath, not an emptyDir, so a restarted pod finds and uploads them."""
    spec = _pod_specs(_render())[GATEWAY]
    gw = spec["containers"][0]
    state = _env(gw)["FEDFAAS_GATEWAY_STATE_DIR"]
    volume = _mount_of(spec, gw, state)
    assert volume["hostPath"]["path"] == "/var/lib/fedfaas/gateway"
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    moved = _pod_specs(_render("nodeGateway.stateHostPath=/srv/fl"))[GATEWAY]
    assert _mount_of(moved, moved["containers"][0], state)["hostPath"]["path"] == "/srv/fl"


def test_gateways_and_control_plane_find_the_gateways_through_the_headless_service() -> None:
    docs = _render()
    svc = _doc(docs, "Service", "rel-fedfaas-node-gateway-peers")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    daemonset = _doc(docs, "DaemonSet", "rel-fedfaas-node-gateway")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    gw = daemonset["spec"]["template"]["spec"]["containers"][0]
    port = svc["spec"]["ports"][0]["port"]
    assert port == gw["ports"][0]["containerPort"] == int(_env(gw)["FEDFAAS_GATEWAY_PORT"])
    name = f"rel-fedfaas-node-gateway-peers.{svc['metadata']['namespace']}.svc:{port}"
    assert _env(gw)["FEDFAAS_GATEWAY_PEERS_SERVICE"] == name
    assert _env(gw)["FEDFAAS_GATEWAY_HOST"] == "0.0.0.0"  # peers reach it at its pod IP
    cp = _pod_specs(docs)["Deployment/rel-fedfaas-control-plane"]["containers"][0]
    assert _env(cp)["FEDFAAS_CONTROL_GATEWAYS_SERVICE"] == name
    # with the chart's defaults, nothing else tells the control plane where gateways are
    assert "FEDFAAS_CONTROL_GATEWAYS" not in _env(cp)


def _referenced(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """``(kind, name)`` of every Secret and ConfigMap a pod spec references."""
    refs: set[tuple[str, str]] = set()
    for v in spec.get("volumes", []):
        if "secret" in v:
            refs.add(("Secret", v["secret"]["secretName"]))
        if "configMap" in v:
            refs.add(("ConfigMap", v["configMap"]["name"]))
        for src in v.get("projected", {}).get("sources", []):
            if "secret" in src:
                refs.add(("Secret", src["secret"]["name"]))
            if "configMap" in src:
                refs.add(("ConfigMap", src["configMap"]["name"]))
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "secretKeyRef" in ref:
                refs.add(("Secret", ref["secretKeyRef"]["name"]))
            if "configMapKeyRef" in ref:
                refs.add(("ConfigMap", ref["configMapKeyRef"]["name"]))
        for src in c.get("envFrom", []):
            if "secretRef" in src:
                refs.add(("Secret", src["secretRef"]["name"]))
            if "configMapRef" in src:
                refs.add(("ConfigMap", src["configMapRef"]["name"]))
    return refs


@pytest.mark.parametrize("sets", [(), ("basicAuth=false",), ("nodeGateway.ebpf.enabled=true",)])
def test_every_secret_and_config_map_a_pod_references_is_rendered_in_its_namespace(
    sets: tuple[str, ...],
) -> None:
    docs = _render(*sets)
    made = {
        (d["kind"], d["metadata"].get("namespace", "openfaas"), d["metadata"]["name"])
        for d in docs
        if d["kind"] in ("Secret", "ConfigMap")
    }
    checked = 0
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            continue
        namespace = d["metadata"].get("namespace", "openfaas")
        for kind, name in _referenced(d["spec"]["template"]["spec"]):
            checked += 1
            if kind == "Secret" and (namespace, name) in EXTERNAL_SECRETS:
                continue
            assert (kind, namespace, name) in made, (
                f"{d['kind']}/{d['metadata']['name']} in {namespace} references {kind} {name}, "
                "which the chart does not make there"
            )
    assert checked >= 8


def test_faas_netes_sees_the_aggregator_as_a_function() -> None:
    """faas-netes lists and scales Deployments in the function namespace whose pods carry
    ``faas_function``, routes to the Service of that name on :8080, and reads the replica counts
    from the Deployment: the chart's aggregator has all of that, under the name the control plane
    scales."""
    docs = _render()
    dep = _doc(docs, "Deployment", "aggregator")
    svc = _doc(docs, "Service", "aggregator")
    for d in (dep, svc):
        assert d["metadata"]["namespace"] == "openfaas-fn"
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"] == {"faas_function": "aggregator"}
    assert pod["metadata"]["labels"]["faas_function"] == "aggregator"
    assert svc["spec"]["selector"] == {"faas_function": "aggregator"}
    port = svc["spec"]["ports"][0]
    assert port["port"] == 8080
    container = pod["spec"]["containers"][0]
    assert container["name"] == "aggregator"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == 8080
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/_/health", "port": "http"}
    cp = _pod_specs(docs)["Deployment/rel-fedfaas-control-plane"]["containers"][0]
    assert _env(cp)["FEDFAAS_CONTROL_FUNCTION"] == "aggregator"
    # the function token every function checks, mounted where faas-netes mounts secrets
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/var/openfaas/secrets"])
    assert volume["secret"]["secretName"] == "fedfaas-function-token"


def test_network_policy_admits_cache_functions_to_minio_and_keeps_redis_to_the_release() -> None:
    docs = _render()
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    minio = policies["rel-fedfaas-minio"]["spec"]
    sources = minio["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openfaas-fn"}}
    } in (sources)
    redis = policies["rel-fedfaas-redis"]["spec"]["ingress"][0]["from"]
    assert all("namespaceSelector" not in s for s in redis)
    # the cache engine and the tracker (which call the cache functions, and which the
    # functions never call) have no policy that could shut them off
    selected = [p["spec"]["podSelector"]["matchLabels"].get("component") for p in policies.values()]
    assert sorted(selected) == ["minio", "redis"]

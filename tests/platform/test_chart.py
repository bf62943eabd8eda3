"""The Helm chart: structure (always), ``helm lint`` and ``helm template`` (where helm exists)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedfaas.services import find_binary

CHART = Path(__file__).resolve().parents[2] / "charts" / "fedfaas"
HELM = find_binary("helm")
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not installed: `make helm` builds it (go install helm.sh/helm/v3)"
)
COMPONENTS = (
    "minio",
    "redis",
    "nodeGateway",
    "aggregator",
    "requestTracker",
    "cacheEngine",
    "controlPlane",
)
CONNECTOR_LABELS = (
    "app",
    "chart",
    "component",
    "heritage",
    "release",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
)


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _lookup(tree: dict[str, Any], path: list[str]) -> bool:
    node: Any = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_chart_metadata_and_values_parse_and_follow_the_connector_conventions() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "fedfaas"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    values = _values()
    assert values["gatewayURL"] == "http://gateway.openfaas:8080"
    assert values["basicAuth"] is True and values["functionNamespace"] == "openfaas-fn"
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert key in values
        for c in COMPONENTS:
            assert key in values[c], f"{c}.{key} missing"
    for c in COMPONENTS:
        assert "resources" in values[c] and "enabled" in values[c], c
    assert values["nodeGateway"]["ebpf"]["enabled"] is False, "privileged must be opt-in"


def test_values_yaml_meets_the_chart_schema_and_bad_values_do_not() -> None:
    import json

    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    values = _values()
    jsonschema.validate(values, schema)
    bad = {**values, "redis": {**values["redis"], "port": "http"}}
    with pytest.raises(jsonschema.ValidationError, match="'http' is not of type 'integer'"):
        jsonschema.validate(bad, schema)


def test_every_value_a_template_reads_exists_in_values_yaml() -> None:
    values = _values()
    missing = set()
    for tpl in (CHART / "templates").iterdir():
        text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", tpl.read_text(), flags=re.S)  # comments
        for ref in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text):
            path = ref.strip(".").split(".")
            if not _lookup(values, path):
                missing.add(f"{tpl.name}: .Values.{'.'.join(path)}")
    assert not missing, sorted(missing)


def test_templates_define_the_stateful_and_per_node_parts() -> None:
    text = {p.name: p.read_text() for p in (CHART / "templates").glob("*.yaml")}
    assert "kind: StatefulSet" in text["minio.yaml"] and "kind: Secret" in text["minio.yaml"]
    assert "kind: StatefulSet" in text["redis.yaml"]
    assert "kind: DaemonSet" in text["node-gateway.yaml"]
    assert (
        "hostIPC" in text["node-gateway.yaml"] and "privileged: true" in text["node-gateway.yaml"]
    )
    for name in ("request-tracker.yaml", "cache-engine.yaml", "control-plane.yaml"):
        assert '"fedfaas.component"' in text[name], name


def _render(*sets: str) -> list[dict[str, Any]]:
    assert HELM is not None
    args = [HELM, "template", "rel", str(CHART), "--namespace", "openfaas"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }


@needs_helm
def test_helm_lint_passes_strict() -> None:
    assert HELM is not None
    for extra in ([], ["--set", "nodeGateway.ebpf.enabled=true"]):
        res = subprocess.run(
            [HELM, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stdout + res.stderr


@needs_helm
def test_helm_refuses_values_that_break_the_schema() -> None:
    assert HELM is not None
    res = subprocess.run(
        [HELM, "template", "rel", str(CHART), "--set", "cacheEngine.policy=mru"],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "cacheEngine/policy" in res.stderr


@needs_helm
def test_rendered_chart_has_every_part_with_connector_labels() -> None:
    docs = _render()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for expected in [
        ("StatefulSet", "rel-fedfaas-minio"),
        ("Service", "rel-fedfaas-minio"),
        ("Secret", "rel-fedfaas-minio"),
        ("StatefulSet", "rel-fedfaas-redis"),
        ("Service", "rel-fedfaas-redis"),
        ("DaemonSet", "rel-fedfaas-node-gateway"),
        ("Deployment", "rel-fedfaas-request-tracker"),
        ("Deployment", "rel-fedfaas-cache-engine"),
        ("Deployment", "rel-fedfaas-control-plane"),
        ("Deployment", "aggregator"),
    ]:
        assert expected in kinds, expected
    for d in docs:
        labels = d["metadata"].get("labels", {})
        for key in CONNECTOR_LABELS:
            assert key in labels, f"{d['kind']}/{d['metadata']['name']} lacks label {key}"


@needs_helm
def test_services_mount_basic_auth_read_only_and_call_the_gateway() -> None:
    specs = _pod_specs(_render())
    for name in (
        "Deployment/rel-fedfaas-control-plane",
        "Deployment/rel-fedfaas-cache-engine",
        "Deployment/rel-fedfaas-request-tracker",
        "DaemonSet/rel-fedfaas-node-gateway",
    ):
        spec = specs[name]
        container = spec["containers"][0]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/var/secrets"].get("readOnly") is True, name
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols[mounts["/var/secrets"]["name"]]["secret"]["secretName"] == "basic-auth"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["basic_auth"] == "true" and env["secret_mount_path"] == "/var/secrets"
        assert env["OPENFAAS_URL"] == "http://gateway.openfaas:8080"


@needs_helm
def test_node_gateway_is_privileged_only_when_ebpf_is_enabled() -> None:
    off = _pod_specs(_render())["DaemonSet/rel-fedfaas-node-gateway"]
    on = _pod_specs(_render("nodeGateway.ebpf.enabled=true"))["DaemonSet/rel-fedfaas-node-gateway"]
    assert off["hostIPC"] is True and on["hostIPC"] is True
    assert not off["containers"][0]["securityContext"].get("privileged")
    assert on["containers"][0]["securityContext"]["privileged"] is True
    host_paths = {v["hostPath"]["path"] for v in on["volumes"] if "hostPath" in v}
    assert {"/dev/shm/fedfaas", "/run/fedfaas", "/lib/modules", "/sys/fs/bpf"} <= host_paths
    assert "/lib/modules" not in {v["hostPath"]["path"] for v in off["volumes"] if "hostPath" in v}


@needs_helm
def test_placement_values_reach_every_pod() -> None:
    specs = _pod_specs(_render("nodeSelector.pool=fl", "redis.nodeSelector.disk=ssd"))
    for name, spec in specs.items():
        expected = {"disk": "ssd"} if "redis" in name else {"pool": "fl"}
        assert spec.get("nodeSelector") == expected, name


@needs_helm
def test_aggregator_is_an_openfaas_function_deployment() -> None:
    docs = _render()
    dep = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "aggregator"
    )
    assert dep["metadata"]["namespace"] == "openfaas-fn"
    assert dep["metadata"]["labels"]["faas_function"] == "aggregator"
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"]["faas_function"] == "aggregator"
    container = pod["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == 8080
    assert container["readinessProbe"]["httpGet"]["path"] == "/_/health"


@needs_helm
@pytest.mark.parametrize(
    ("workload", "module"),
    [
        ("DaemonSet/rel-fedfaas-node-gateway", "gateway.settings"),
        ("Deployment/rel-fedfaas-cache-engine", "cache_engine.settings"),
        ("Deployment/rel-fedfaas-request-tracker", "request_tracker.settings"),
        ("Deployment/rel-fedfaas-control-plane", "control_plane.settings"),
    ],
)
def test_component_env_names_are_fields_of_its_settings_class(workload: str, module: str) -> None:
    from pydantic_settings import BaseSettings

    mod = pytest.importorskip(module)
    classes = [
        c
        for c in vars(mod).values()
        if isinstance(c, type) and issubclass(c, BaseSettings) and c.__module__ == module
    ]
    assert classes, f"no settings class in {module}"
    settings_cls = classes[0]
    prefix = settings_cls.model_config["env_prefix"]
    env = _pod_specs(_render())[workload]["containers"][0]["env"]
    ours = [e["name"] for e in env if e["name"].startswith(prefix)]
    assert any(n == f"{prefix}PORT" for n in ours)
    unknown = [n for n in ours if n[len(prefix) :].lower() not in settings_cls.model_fields]
    assert not unknown, f"{workload}: {unknown} are not fields of {settings_cls.__name__}"

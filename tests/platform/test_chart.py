"""The Helm chart: structure (always), ``helm lint`` and ``helm template`` (where helm exists)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.services import find_binary

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
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
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


#: the secret files each pod mounts (file name in its secrets folder), with basicAuth on
SECRET_FILES = {
    "DaemonSet/rel-fedfaas-node-gateway": {
        "redis-gateway.json",
        "minio-gateway.json",
        "gateway-admin-secret",
        "service-token",
    },
    "Deployment/rel-fedfaas-cache-engine": {
        "redis-cache-engine.json",
        "minio-cache-engine.json",
        "admin-token",
        "service-token",
        "function-token",
        "basic-auth-user",
        "basic-auth-password",
    },
    "Deployment/rel-fedfaas-request-tracker": {
        "redis-request-tracker.json",
        "admin-token",
        "analyst-token",
        "service-token",
        "function-token",
    },
    "Deployment/rel-fedfaas-control-plane": {
        "redis-control-plane.json",
        "gateway-admin-secret",
        "analyst-token",
        "basic-auth-user",
        "basic-auth-password",
    },
    "Deployment/aggregator": {"fedfaas-function-token"},
    "StatefulSet/rel-fedfaas-minio": {"root-user", "root-password"},
    "StatefulSet/rel-fedfaas-redis": {"users.acl"},
    "Job/rel-fedfaas-minio-provision": {
        "minio-root-user",
        "minio-root-password",
        "minio-gateway.json",
        "minio-cache-engine.json",
    },
}


def _secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Rendered Secrets, ``namespace/name`` -> key -> decoded value."""
    import base64

    return {
        f"{d['metadata']['namespace']}/{d['metadata']['name']}": {
            k: base64.b64decode(v).decode() for k, v in (d.get("data") or {}).items()
        }
        for d in docs
        if d["kind"] == "Secret"
    }


def _mounted_files(docs: list[dict[str, Any]], workload: str) -> dict[str, tuple[str, str, int]]:
    """Files from Secrets that ``workload``'s first container sees: path -> (secret, key, mode).

    Every secret volume must be mounted read-only.
    """
    spec = _pod_specs(docs)[workload]
    namespace = next(
        d["metadata"]["namespace"]
        for d in docs
        if f"{d['kind']}/{d['metadata']['name']}" == workload
    )
    secrets = _secrets(docs)
    volumes: dict[str, list[tuple[str, str, str, int]]] = {}
    for v in spec.get("volumes", []):
        if "secret" in v:
            sources = [{"secret": {**v["secret"], "name": v["secret"]["secretName"]}}]
            mode = v["secret"].get("defaultMode", 0o644)
        elif "projected" in v:
            sources, mode = v["projected"]["sources"], v["projected"].get("defaultMode", 0o644)
        else:
            continue
        files = []
        for src in sources:
            sec = src["secret"]
            items = sec.get("items") or [
                {"key": k, "path": k} for k in secrets.get(f"{namespace}/{sec['name']}", {})
            ]
            assert items, f"{workload}: secret {sec['name']} mounted whole but not rendered"
            files += [(sec["name"], i["key"], i["path"], i.get("mode", mode)) for i in items]
        volumes[v["name"]] = files
    out: dict[str, tuple[str, str, int]] = {}
    for m in spec["containers"][0].get("volumeMounts", []):
        if m["name"] in volumes:
            assert m.get("readOnly") is True, f"{workload}: {m['mountPath']} is writable"
            for secret, key, path, mode in volumes[m["name"]]:
                out[f"{m['mountPath']}/{path}"] = (secret, key, mode)
    return out


@needs_helm
@pytest.mark.parametrize("basic_auth", [True, False])
def test_each_pod_mounts_only_its_secret_files_read_only(basic_auth: bool) -> None:
    docs = _render(f"basicAuth={str(basic_auth).lower()}")
    for workload, expected in SECRET_FILES.items():
        if not basic_auth:
            expected = {f for f in expected if not f.startswith("basic-auth")}
        files = _mounted_files(docs, workload)
        assert {Path(f).name for f in files} == expected, workload
        for path, (_, _, mode) in files.items():
            # owner root, group the pod's fsGroup: a non-root container reads, nobody else
            assert mode in (0o400, 0o440), f"{workload}: {path} mode {mode:o}"
        if any(mode & 0o040 for _, _, mode in files.values()):
            assert _pod_specs(docs)[workload]["securityContext"]["fsGroup"], workload


@needs_helm
@pytest.mark.parametrize("basic_auth", [True, False])
def test_every_file_setting_names_a_file_the_pod_mounts(basic_auth: bool) -> None:
    """``*_FILE`` settings are mounted files; ``*_AUTH_DIR`` holds the basic-auth pair."""
    docs = _render(f"basicAuth={str(basic_auth).lower()}")
    for workload in SECRET_FILES:
        files = _mounted_files(docs, workload)
        env = {
            e["name"]: e.get("value")
            for e in _pod_specs(docs)[workload]["containers"][0].get("env", [])
        }
        for name, value in env.items():
            if name.endswith("_FILE"):
                assert value in files, f"{workload}: {name}={value} is not a mounted file"
            if name.endswith("_AUTH_DIR"):
                assert basic_auth, f"{workload}: {name} set without basic auth"
                assert {f"{value}/basic-auth-user", f"{value}/basic-auth-password"} <= set(files)


@needs_helm
def test_every_token_has_one_value_and_functions_get_theirs_as_an_openfaas_secret() -> None:
    from runtime.function_auth import DEFAULT_SECRETS_DIR, TOKEN_SECRET

    docs = _render()
    secrets = _secrets(docs)
    tokens = secrets["openfaas/rel-fedfaas-tokens"]
    assert set(tokens) == {
        "gateway-admin-secret",
        "admin-token",
        "analyst-token",
        "service-token",
        "function-token",
    }
    assert len(set(tokens.values())) == len(tokens) and all(len(v) >= 32 for v in tokens.values())
    # the OpenFaaS secret of the functions of stack.yml, in the function namespace
    assert secrets[f"openfaas-fn/{TOKEN_SECRET}"] == {TOKEN_SECRET: tokens["function-token"]}
    files = _mounted_files(docs, "Deployment/aggregator")
    assert files == {f"{DEFAULT_SECRETS_DIR}/{TOKEN_SECRET}": (TOKEN_SECRET, TOKEN_SECRET, 0o440)}
    kept = {
        f"{d['metadata']['namespace']}/{d['metadata']['name']}"
        for d in docs
        if d["kind"] == "Secret"
        and d["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"
    }
    assert kept == {
        "openfaas/rel-fedfaas-minio",
        "openfaas/rel-fedfaas-tokens",
        f"openfaas-fn/{TOKEN_SECRET}",
        "openfaas/rel-fedfaas-minio-users",
        "openfaas/rel-fedfaas-redis-users",
        "openfaas/rel-fedfaas-tls-ca",  # the CA the chart makes (TLS by default)
    }


def _secret_values(docs: list[dict[str, Any]]) -> set[str]:
    """Every password and token the rendered Secrets hold (user names are not secret)."""
    import json

    out: set[str] = set()
    for data in _secrets(docs).values():
        for key, value in data.items():
            if key.endswith(".json"):
                out.add(json.loads(value)["password"])
            elif key not in ("root-user", "users.acl"):
                out.add(value)
    return out


@needs_helm
def test_no_secret_value_is_in_any_env_or_command_line() -> None:
    docs = _render("minio.rootPassword=rootPasswordGivenAsAValue")
    values = _secret_values(docs)
    assert "rootPasswordGivenAsAValue" in values and len(values) >= 12
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec")
        if not spec:
            continue
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            where = f"{d['kind']}/{d['metadata']['name']}/{c['name']}"
            assert not c.get("envFrom"), f"{where}: envFrom"
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), f"{where}: {e['name']}"
            text = yaml.safe_dump([c.get("env", []), c.get("args", []), c.get("command", [])])
            leaked = [v for v in values if v in text]
            assert not leaked, f"{where} holds a secret value"


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


NODE_FOLDERS = ("/dev/shm/fedfaas", "/run/fedfaas", "/var/lib/fedfaas/gateway")


@needs_helm
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize(("ebpf", "before", "after"), [(True, 12000, 0), (False, 0, 12000)])
def test_turning_ebpf_on_or_off_hands_what_the_last_gateway_left_to_the_new_uid(
    tmp_path: Path, ebpf: bool, before: int, after: int
) -> None:
    """Regression: with eBPF turned on for a node whose gateway had run jobs, the gateway (now
    root) refused the store folder uid 12000 had made, and stayed in CrashLoopBackOff. The
    rendered ``node-folders`` command is run here, with the container's capabilities alone
    (``setpriv``), on folders the other uid left: a private store with a job's object in it,
    and a link out of the tree, which must not be followed."""
    spec = _pod_specs(_render(f"nodeGateway.ebpf.enabled={str(ebpf).lower()}"))[
        "DaemonSet/rel-fedfaas-node-gateway"
    ]
    (init,) = (c for c in spec["initContainers"] if c["name"] == "node-folders")
    ctx = init["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["capabilities"]["drop"] == ["ALL"]
    assert spec["containers"][0]["securityContext"]["runAsUser"] == after
    outside = tmp_path / "outside"
    outside.write_text("not the platform's")
    host = {f: tmp_path / "host" / f.strip("/").replace("/", "_") for f in NODE_FOLDERS}
    store = host["/dev/shm/fedfaas"] / "store" / "job-a"
    store.mkdir(parents=True)
    (store / "object").write_bytes(b"update")
    (store / "link").symlink_to(outside)
    host["/run/fedfaas"].mkdir()
    host["/var/lib/fedfaas/gateway"].mkdir()
    made = [p for d in host.values() for p in (d, *d.rglob("*"))]
    for path in made:
        os.lchown(path, before, before)
    for folder in (store.parent, store):
        folder.chmod(0o700)
    command = [host.get(a, a) for a in init["command"]]
    caps = ",".join(f"+{c.lower()}" for c in ctx["capabilities"]["add"])
    setpriv = ["setpriv", f"--bounding-set=-all,{caps}", f"--inh-caps=-all,{caps}"]
    subprocess.run([*setpriv, *map(str, command)], check=True, timeout=30)
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in made} == {(after, after)}
    assert (outside.stat().st_uid, outside.read_text()) == (0, "not the platform's")
    # what the gateway checks of its store at start (core.objstore.root): its own, private
    assert {oct(f.stat().st_mode & 0o777) for f in (store.parent, store)} == {"0o700"}


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


# ------------------------------------------------------------------ one source of truth
def _helper_yaml(name: str) -> Any:
    """The YAML body of ``define name`` in _helpers.tpl."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    m = re.search(
        r'\{\{-? define "' + re.escape(name) + r'" -?\}\}\n(.*?)\{\{-? end -?\}\}', text, re.S
    )
    assert m is not None, name
    return yaml.safe_load(m.group(1))


def test_chart_users_are_those_of_fedfaas_services() -> None:
    """The chart's Redis ACL table and MinIO users are core.services' (no drift, no helm needed)."""
    from core.services import REDIS_USERS, minio_policies

    assert _helper_yaml("fedfaas.redisUsers") == REDIS_USERS
    assert _helper_yaml("fedfaas.minioUsers") == list(minio_policies("fedfaas"))


@needs_helm
def test_rendered_redis_acl_is_services_users_with_their_passwords_hashed() -> None:
    import hashlib
    import json

    from core.services import REDIS_USERS

    secrets = _secrets(_render())
    users = secrets["openfaas/rel-fedfaas-redis-users"]
    lines = secrets["openfaas/rel-fedfaas-redis-acl"]["users.acl"].splitlines()
    assert lines[0] == "user default off"
    rules: dict[str, str] = {}
    for line in lines[1:]:
        m = re.fullmatch(r"user (\S+) on #([0-9a-f]{64}) (.+)", line)
        assert m is not None, line
        user, digest, rules[user] = m.groups()
        doc = json.loads(users[f"redis-{user}.json"])
        assert doc["username"] == user
        assert hashlib.sha256(doc["password"].encode()).hexdigest() == digest
        assert doc["password"] not in line
    assert rules == REDIS_USERS
    assert set(users) == {f"redis-{u}.json" for u in REDIS_USERS}


@needs_helm
def test_minio_users_are_made_by_a_hook_job_running_the_provisioning_entry_point() -> None:
    import json

    from core.services import (
        MINIO_ROOT_PASSWORD,
        MINIO_ROOT_USER,
        minio_policies,
        minio_user_file,
    )
    from fedfaas.provision_minio import parser

    docs = _render()
    users = _secrets(docs)["openfaas/rel-fedfaas-minio-users"]
    assert set(users) == {minio_user_file(Path(), u).name for u in minio_policies("fedfaas")}
    for user in minio_policies("fedfaas"):
        assert json.loads(users[f"minio-{user}.json"])["username"] == f"fedfaas-{user}"
    job = next(d for d in docs if d["kind"] == "Job")
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "post-install,post-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == next(
        c["image"] for c in _pod_specs(docs)["Deployment/rel-fedfaas-cache-engine"]["containers"]
    )
    assert container["command"] == ["python", "-m", "fedfaas.provision_minio"]
    args = parser().parse_args(container["args"])
    assert args.endpoint == "rel-fedfaas-minio.openfaas:9000" and args.bucket == "fedfaas"
    files = _mounted_files(docs, "Job/rel-fedfaas-minio-provision")
    root = args.root_credentials_dir
    assert files[f"{root}/{MINIO_ROOT_USER}"][:2] == ("rel-fedfaas-minio", "root-user")
    assert files[f"{root}/{MINIO_ROOT_PASSWORD}"][:2] == ("rel-fedfaas-minio", "root-password")
    for user in minio_policies("fedfaas"):
        path = str(minio_user_file(args.users_dir, user))
        assert files[path][:2] == ("rel-fedfaas-minio-users", Path(path).name)
    # MinIO reads its root credentials from files too
    minio = _pod_specs(docs)["StatefulSet/rel-fedfaas-minio"]["containers"][0]
    env = {e["name"]: e.get("value") for e in minio["env"]}
    minio_files = _mounted_files(docs, "StatefulSet/rel-fedfaas-minio")
    assert minio_files[env["MINIO_ROOT_USER_FILE"]][1] == "root-user"
    assert minio_files[env["MINIO_ROOT_PASSWORD_FILE"]][1] == "root-password"
    assert "MINIO_ROOT_USER" not in env and "MINIO_ROOT_PASSWORD" not in env


@needs_helm
def test_redis_starts_with_the_acl_file_and_is_probed_without_a_user() -> None:
    docs = _render()
    redis = _pod_specs(docs)["StatefulSet/rel-fedfaas-redis"]["containers"][0]
    args = redis["args"]
    acl = args[args.index("--aclfile") + 1]
    assert _mounted_files(docs, "StatefulSet/rel-fedfaas-redis")[acl][:2] == (
        "rel-fedfaas-redis-acl",
        "users.acl",
    )
    assert "NOAUTH" in " ".join(redis["readinessProbe"]["exec"]["command"])


@pytest.mark.slow  # over 5 s: `make test-slow`
@needs_helm
@pytest.mark.integration
def test_a_real_redis_with_the_rendered_acl_admits_each_component_to_its_keys_only(
    tmp_path: Path,
) -> None:
    import json

    import redis

    from core.services import find_binary, free_port, spawn, stop_group, wait_for_port

    docs = _render()
    secrets = _secrets(docs)
    acl = tmp_path / "users.acl"
    acl.write_text(secrets["openfaas/rel-fedfaas-redis-acl"]["users.acl"])
    binary = find_binary("redis-server")
    assert binary is not None
    port = free_port()
    proc = spawn(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--aclfile", str(acl)]
        + ["--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        log_path=tmp_path / "redis.log",
    )
    try:
        wait_for_port("127.0.0.1", port, 20, proc)
        # the readiness probe, as the chart runs it, without a user
        probe = _pod_specs(docs)["StatefulSet/rel-fedfaas-redis"]["containers"][0]
        command = probe["readinessProbe"]["exec"]["command"]
        command = [c.replace("-p 6379", f"-p {port}") for c in command]
        assert subprocess.run(command, capture_output=True).returncode == 0
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()

        def login(user: str) -> redis.Redis:
            doc = json.loads(secrets["openfaas/rel-fedfaas-redis-users"][f"redis-{user}.json"])
            return redis.Redis(port=port, username=doc["username"], password=doc["password"])

        gateway = login("gateway")
        gateway.set("fedfaas:job:x", b"1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            gateway.set("flstore:x", b"1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            gateway.config_get("*")
        assert login("cache-engine").set("flstore:x", b"1")
        assert login("admin").get("fedfaas:job:x") == b"1"
    finally:
        stop_group(proc, 10)


@needs_helm
def test_the_control_plane_asks_the_releases_request_tracker_for_oort_rounds() -> None:
    """Jobs with ``selection: oort`` ask the tracker: the control plane's tracker URL is the
    tracker's Service (name and port) and its token file is the analyst token it mounts; a
    release without the tracker leaves both out (such jobs' rounds are then random)."""

    def control_env(docs: list[dict[str, Any]]) -> dict[str, str]:
        spec = _pod_specs(docs)["Deployment/rel-fedfaas-control-plane"]
        return {e["name"]: e.get("value", "") for e in spec["containers"][0].get("env", [])}

    docs = _render()
    svc = next(
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == "rel-fedfaas-request-tracker"
    )
    env = control_env(docs)
    port = svc["spec"]["ports"][0]["port"]
    assert (
        env["FEDFAAS_CONTROL_TRACKER_URL"] == f"https://rel-fedfaas-request-tracker.openfaas:{port}"
    )
    token = env["FEDFAAS_CONTROL_TRACKER_TOKEN_FILE"]
    assert _mounted_files(docs, "Deployment/rel-fedfaas-control-plane")[token][1] == "analyst-token"
    off = control_env(_render("requestTracker.enabled=false"))
    assert (
        "FEDFAAS_CONTROL_TRACKER_URL" not in off and "FEDFAAS_CONTROL_TRACKER_TOKEN_FILE" not in off
    )


def test_the_chart_turns_the_zero_copy_handoff_off_where_the_engine_is_on() -> None:
    """faas-netes cannot mount a node's store into a cache function: a gateway that kept
    rounds' updates for a handoff nobody claims would only hold memory."""
    text = (CHART / "templates" / "node-gateway.yaml").read_text()
    block = text[text.index("{{- if $engine }}") :]
    block = block[: block.index("{{- end }}")]
    env = re.findall(r"- name: (\S+)\s+value: (\S+)", block)
    assert ("FEDFAAS_GATEWAY_HANDOFF_TTL_S", '"0"') in env, env

"""The env names that stack.platform.yml, the chart and the runtime set are the names the settings read.

Every env var the chart sets on a FedFaaS component is a setting of that component's settings
class (a name nobody reads is a silent misconfiguration, or a leftover such as the MinIO keys the
components no longer take as values).

An ``aggregator`` replica finds its node's router through one setting,
``FEDFAAS_GATEWAY_ROUTER_SOCKET`` (:data:`core.node.ROUTER_SOCKET_ENV`): the node gateway
reads it as ``GatewaySettings.router_socket``, the replica as ``AggregatorSettings.router_socket``
(a ``validation_alias``, so the replica ignores ``FEDFAAS_AGGREGATOR_ROUTER_SOCKET``). A name
that drifts on one side is silently ignored, and the replica never registers an endpoint.

The chart is read twice: rendered by helm where it exists (as ``test_chart.py`` does), and from
the templates' text everywhere (``- name:`` lines, the env helpers they include, the ``env``
maps of values.yaml), so the checks run on machines without helm too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from cache_engine.settings import EngineSettings
from control_plane.settings import ControlPlaneSettings
from core.node import ROUTER_SOCKET_ENV
from core.stackfile import PLATFORM_STACK
from functions.aggregator.settings import AggregatorSettings
from gateway.settings import GatewaySettings
from request_tracker.settings import TrackerSettings
from runtime.provider import node_env
from tests.platform.test_chart import CHART, _pod_specs, _render, needs_helm

ROOT = Path(__file__).resolve().parents[2]
#: workload -> (template, kind, name of the rendered workload)
WORKLOADS = {
    "aggregator": ("aggregator.yaml", "Deployment", "Deployment/aggregator"),
    "node-gateway": ("node-gateway.yaml", "DaemonSet", "DaemonSet/rel-fedfaas-node-gateway"),
    "cache-engine": ("cache-engine.yaml", "Deployment", "Deployment/rel-fedfaas-cache-engine"),
    "request-tracker": (
        "request-tracker.yaml",
        "Deployment",
        "Deployment/rel-fedfaas-request-tracker",
    ),
    "control-plane": ("control-plane.yaml", "Deployment", "Deployment/rel-fedfaas-control-plane"),
}
#: the FedFaaS components the chart runs, and the settings class each reads
SETTINGS: dict[str, type[BaseSettings]] = {
    "node-gateway": GatewaySettings,
    "cache-engine": EngineSettings,
    "request-tracker": TrackerSettings,
    "control-plane": ControlPlaneSettings,
}
#: a workload's env (name -> literal value, None when computed) and mounts (path -> host path)
Pod = tuple[dict[str, str | None], dict[str, str | None]]


def env_names(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """Env name -> field, as pydantic-settings reads them: an alias, else prefix + field name."""
    prefix = settings_cls.model_config.get("env_prefix", "")
    names: dict[str, str] = {}
    for field, info in settings_cls.model_fields.items():
        alias = info.validation_alias or info.alias
        if isinstance(alias, str):
            choices = [alias]
        elif isinstance(alias, AliasChoices):
            choices = [c for c in alias.choices if isinstance(c, str)]
        else:
            choices = [prefix + field]
        names.update({c.upper(): field for c in choices})
    return names


#: set by the chart only to be expanded into another variable's value (``$(NAME)``: the node's
#: name in a second gateway's node name, nodeGateway.perNode); no part reads it
EXPANDED_ONLY = {"K8S_NODE_NAME"}


def unread(env: dict[str, Any], settings_cls: type[BaseSettings], *prefixes: str) -> list[str]:
    """Names in ``env`` under ``prefixes`` that ``settings_cls`` does not read."""
    known = set(env_names(settings_cls)) | EXPANDED_ONLY
    return sorted(n for n in env if n.upper().startswith(prefixes) and n.upper() not in known)


# ------------------------------------------------------------------ the chart, from its text
def _helpers() -> dict[str, str]:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    parts = re.split(r'\{\{-?\s*define\s+"([^"]+)"\s*-?\}\}', text)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _lookup(values: dict[str, Any], path: str) -> Any:
    node: Any = values
    for key in path.strip(".").split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def template_pod(text: str, kind: str, values: dict[str, Any]) -> Pod:
    """Env and mounts of the first container of the ``kind`` workload in a template's text.

    Reads ``- name:``/``value:`` lines, the helpers they ``include`` (with a ``"prefix"``
    argument), a ``with $x.env`` map from ``values``, and ``{{ $x.a.b }}`` or
    ``{{ .Values.a.b }}`` values; any other template value is ``None``. ``if`` blocks are read
    as if true. A template that includes ``fedfaas.component`` is read from its arguments:
    the ``(dict "name" ... "value" ...)`` entries of its env list, ``<prefix>HOST`` and
    ``<prefix>PORT`` (set by ``_component.tpl``) and the component's ``env`` map.
    """
    if '"fedfaas.component"' in text:
        return component_pod(text, values)
    aliases = dict(re.findall(r"\{\{-?\s*(\$\w+)\s*:=\s*\.Values\.([\w.]+)\s*-?\}\}", text))

    def resolve(expr: str) -> str | None:
        m = re.fullmatch(r"\{\{\s*(\$\w+|\.Values)\.([\w.]+)\s*\}\}", expr.strip())
        if m is None:
            return None if "{{" in expr else expr.strip().strip("\"'")
        base = "" if m.group(1) == ".Values" else aliases[m.group(1)]
        found = _lookup(values, f"{base}.{m.group(2)}")
        return None if found is None else str(found)

    doc = next(d for d in re.split(r"^---$", text, flags=re.M) if f"kind: {kind}" in d)
    block = re.search(r"^( *)env:\n(.*?)^\1(?:ports|volumeMounts|resources):", doc, re.M | re.S)
    assert block is not None, f"no env list in the {kind}"
    env: dict[str, str | None] = {}
    helpers = _helpers()
    extra: str | None = None
    name = ""
    for line in block.group(2).splitlines():
        if m := re.search(r"^\s*- name: (\S+)", line):
            name = m.group(1)
            env[name] = None
        elif m := re.search(r"^\s*value: (.+)$", line):
            env[name] = resolve(m.group(1))
        elif m := re.search(r"\{\{-?\s*with (\$\w+)\.(\w+)", line):
            extra = f"{aliases[m.group(1)]}.{m.group(2)}"
        elif m := re.search(r'include "([^"]+)"(.*)', line):
            if m.group(1) == "fedfaas.extraEnv" and extra:
                env.update({k: str(v) for k, v in (_lookup(values, extra) or {}).items()})
                continue
            prefix = re.search(r'"prefix"\s+"([^"]*)"', m.group(2))
            body = helpers[m.group(1)].replace("{{ .prefix }}", prefix.group(1) if prefix else "")
            env.update(dict.fromkeys(re.findall(r"^- name: (\S+)$", body, flags=re.M)))
    mounts = dict(re.findall(r"- name: (\S+)\n\s+mountPath: (\S+)", doc))
    host = dict(re.findall(r"- name: (\S+)\n\s+hostPath:\n\s+path: (.+)", doc))
    return env, {path: resolve(host[vol]) if vol in host else None for vol, path in mounts.items()}


def component_pod(text: str, values: dict[str, Any]) -> Pod:
    """Env of a ``fedfaas.component`` template (see :func:`template_pod`); literal values only."""
    call = re.search(r'include "fedfaas.component" \(dict (.*)\)', text)
    assert call is not None
    prefix = re.search(r'"prefix" "(\w+)"', call.group(1))
    key = re.search(r'"c" \.Values\.(\w+)', call.group(1))
    assert prefix is not None and key is not None
    env: dict[str, str | None] = {
        f"{prefix.group(1)}HOST": "0.0.0.0",
        f"{prefix.group(1)}PORT": None,
    }
    for name, value in re.findall(r'\(dict "name" "(\w+)" "value" ([^)]*?)\)', text):
        env[name] = value.strip('"') if re.fullmatch(r'"[^"]*"', value) else None
    env.update({k: str(v) for k, v in (values[key.group(1)].get("env") or {}).items()})
    return env, {}


def rendered_pod(docs: list[dict[str, Any]], workload: str) -> Pod:
    spec = _pod_specs(docs)[workload]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return env, {m["mountPath"]: host.get(m["name"]) for m in container["volumeMounts"]}


@pytest.fixture(params=["template", pytest.param("helm", marks=needs_helm)])
def chart(request: pytest.FixtureRequest) -> dict[str, Pod]:
    """Workload -> its pod, read from the templates' text or rendered by helm."""
    if request.param == "helm":
        docs = _render()
        return {w: rendered_pod(docs, name) for w, (_, _, name) in WORKLOADS.items()}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {
        w: template_pod((CHART / "templates" / tpl).read_text(), kind, values)
        for w, (tpl, kind, _) in WORKLOADS.items()
    }


def stack_aggregator_env() -> dict[str, str]:
    stack = yaml.safe_load(PLATFORM_STACK.read_text())
    return {k: str(v) for k, v in stack["functions"]["aggregator"]["environment"].items()}


# ------------------------------------------------------------------ the tests
def test_env_names_come_from_the_settings_classes_as_pydantic_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = env_names(AggregatorSettings)
    assert names[ROUTER_SOCKET_ENV] == "router_socket"
    assert names["FEDFAAS_AGGREGATOR_ENDPOINTS"] == "endpoints"
    assert "FEDFAAS_AGGREGATOR_ROUTER_SOCKET" not in names
    # the alias replaces the prefixed name: a chart that set this one would be ignored
    monkeypatch.setenv("FEDFAAS_AGGREGATOR_ROUTER_SOCKET", "/elsewhere.sock")
    monkeypatch.delenv(ROUTER_SOCKET_ENV, raising=False)
    assert AggregatorSettings().router_socket is None
    assert env_names(GatewaySettings)[ROUTER_SOCKET_ENV] == "router_socket"


def test_platform_stack_sets_only_aggregator_names_the_replica_reads() -> None:
    env = stack_aggregator_env()
    assert ROUTER_SOCKET_ENV in env
    bad = unread(env, AggregatorSettings, "FEDFAAS_AGGREGATOR_", "FEDFAAS_GATEWAY_")
    assert not bad, (
        f"stack.platform.yml sets {bad} on the aggregator; AggregatorSettings reads none"
    )


def test_chart_sets_only_aggregator_names_the_replica_reads(chart: dict[str, Pod]) -> None:
    env, _ = chart["aggregator"]
    assert ROUTER_SOCKET_ENV in env
    bad = unread(env, AggregatorSettings, "FEDFAAS_AGGREGATOR_", "FEDFAAS_GATEWAY_")
    assert not bad, f"the chart sets {bad} on the aggregator; AggregatorSettings reads none"


def test_chart_sets_only_gateway_names_the_node_gateway_reads(chart: dict[str, Pod]) -> None:
    env, _ = chart["node-gateway"]
    assert {
        ROUTER_SOCKET_ENV,
        "FEDFAAS_GATEWAY_PORT",
        "FEDFAAS_GATEWAY_MINIO_CREDENTIALS_FILE",
        "FEDFAAS_GATEWAY_REDIS_CREDENTIALS_FILE",
        "FEDFAAS_GATEWAY_ADMIN_SECRET_FILE",
    } <= set(env)
    bad = unread(env, GatewaySettings, "FEDFAAS_GATEWAY_")
    assert not bad, f"the chart sets {bad} on the node gateway; GatewaySettings reads none"


@pytest.mark.parametrize("component", sorted(SETTINGS))
def test_chart_sets_only_names_each_component_reads(chart: dict[str, Pod], component: str) -> None:
    """Every env var of the component's container, whatever its prefix, is one of its settings."""
    settings_cls = SETTINGS[component]
    env, _ = chart[component]
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    assert {f"{prefix}PORT", f"{prefix}REDIS_URL", f"{prefix}REDIS_CREDENTIALS_FILE"} <= set(env)
    bad = unread(env, settings_cls, "")
    assert not bad, f"the chart sets {bad} on {component}; {settings_cls.__name__} reads none"
    # secrets are files: each credential setting the chart gives is a path
    for name, value in env.items():
        if name.endswith("_FILE"):
            assert value is not None and value.startswith("/var/secrets/"), (name, value)


def test_gateway_and_aggregator_meet_at_one_router_socket_on_the_node(
    chart: dict[str, Pod],
) -> None:
    (agg_env, agg_mounts), (gw_env, gw_mounts) = chart["aggregator"], chart["node-gateway"]
    socket = gw_env[ROUTER_SOCKET_ENV]
    assert socket is not None and socket == agg_env[ROUTER_SOCKET_ENV]
    assert stack_aggregator_env()[ROUTER_SOCKET_ENV] == socket
    # the same host folder behind the socket's folder in both pods
    folder = str(Path(socket).parent)
    assert gw_mounts.get(folder) is not None, f"node gateway does not mount {folder}"
    assert agg_mounts.get(folder) == gw_mounts[folder]


def test_runtime_gives_each_replica_the_router_socket_both_settings_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    socket = tmp_path / "router-b.sock"
    env = node_env("b", socket)
    ours = {n for n in env if n in env_names(AggregatorSettings) or n in env_names(GatewaySettings)}
    assert ours == {ROUTER_SOCKET_ENV, "FEDFAAS_NODE"} and env[ROUTER_SOCKET_ENV] == str(socket)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert AggregatorSettings().router_socket == socket
    assert AggregatorSettings().node == "b"
    assert GatewaySettings().router_socket == socket
    assert GatewaySettings(node="b").socket_path() == socket

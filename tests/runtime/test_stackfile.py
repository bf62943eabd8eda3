"""Unit tests: stack.yml parsing into the bodies faas-cli sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.stackfile import StackError, envsubst, load_stack, parse_stack, resolve_gateway
from runtime.images import image_repository

BASIC = """
version: 1.0
provider:
  name: openfaas
  gateway: http://10.0.0.1:8080
functions:
  fn-a:
    lang: python3-http
    handler: ./fn-a
    image: ${REG:-docker.io/me}/fn-a:${TAG}
    environment:
      exec_timeout: 10m
      ratio: 1.10
      flag: true
    environment_file:
      - env1.yml
      - env2.yml
    labels:
      com.openfaas.scale.min: 2
    secrets: [s1]
    constraints: ["node=a"]
    limits: {memory: 512Mi}
    requests: {cpu: "", memory: ""}
    readonly_root_filesystem: true
    namespace: openfaas-fn
  fn-b:
    lang: python3-http
    handler: ./fn-b
    image: fn-b:latest
    fprocess: python custom.py
"""


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "env1.yml").write_text("environment:\n  a: one\n  exec_timeout: 1m\n")
    (tmp_path / "env2.yml").write_text("environment:\n  a: two\n")
    tpl = tmp_path / "template" / "python3-http"
    tpl.mkdir(parents=True)
    (tpl / "template.yml").write_text("language: python3-http\nfprocess: python index.py\n")
    (tmp_path / "stack.yml").write_text(BASIC)
    return tmp_path


def test_deployment_body_is_what_faas_cli_sends(tree: Path) -> None:
    stack = load_stack(tree / "stack.yml", env={"TAG": "1.2"})
    a, b = stack.functions["fn-a"], stack.functions["fn-b"]
    assert a.deployment() == {
        "service": "fn-a",
        "image": "docker.io/me/fn-a:1.2",
        "envProcess": "python index.py",  # read from template/python3-http/template.yml
        "envVars": {"exec_timeout": "1m", "ratio": "1.10", "flag": "true", "a": "two"},
        "constraints": ["node=a"],
        "secrets": ["s1"],
        "labels": {"com.openfaas.scale.min": "2"},
        "annotations": {},
        "limits": {"memory": "512Mi"},
        "readOnlyRootFilesystem": True,
        "namespace": "openfaas-fn",
    }
    body_b = b.deployment()
    assert body_b["envProcess"] == "python custom.py"
    assert body_b["labels"] == {} and body_b["annotations"] == {}
    for absent in ("envVars", "secrets", "constraints", "limits", "requests", "namespace"):
        assert absent not in body_b
    assert stack.gateway == "http://10.0.0.1:8080"
    assert stack.image_map() == {
        "docker.io/me/fn-a:1.2": tree / "fn-a",
        "fn-b:latest": tree / "fn-b",
    }


def test_filter_selects_functions_by_glob(tree: Path) -> None:
    stack = load_stack(tree / "stack.yml", env={"TAG": "1"})
    assert [f.name for f in stack.select("*-b")] == ["fn-b"]
    assert [f.name for f in stack.select()] == ["fn-a", "fn-b"]


def test_provider_must_be_openfaas_and_version_1_0(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="provider.name must be 'openfaas'"):
        parse_stack("provider: {name: faas}\nfunctions: {}\n", tmp_path / "s.yml")
    with pytest.raises(StackError, match="version must be 1.0"):
        parse_stack("version: 2.0\nprovider: {name: openfaas}\n", tmp_path / "s.yml")
    with pytest.raises(StackError, match="not valid YAML"):
        parse_stack("provider: [\n", tmp_path / "s.yml")


def test_missing_template_without_fprocess_is_an_error_that_says_how_to_fix_it(
    tmp_path: Path,
) -> None:
    text = "provider: {name: openfaas}\nfunctions:\n  f:\n    lang: go\n    handler: ./f\n    image: f\n"
    with pytest.raises(StackError, match="set `fprocess:` or add the template"):
        parse_stack(text, tmp_path / "s.yml")
    assert parse_stack(text, tmp_path / "s.yml", read_template=False).functions["f"].fprocess == ""


def test_missing_environment_file_is_an_error(tmp_path: Path) -> None:
    text = (
        "provider: {name: openfaas}\nfunctions:\n  f:\n    fprocess: x\n    image: f\n"
        "    environment_file: [nope.yml]\n"
    )
    with pytest.raises(StackError, match="nope.yml not found"):
        parse_stack(text, tmp_path / "s.yml")


def test_envsubst_handles_defaults_bare_names_and_escapes() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert envsubst("${A}-$A-${B}-${B:-d}-${EMPTY:-d}-${EMPTY-d}-$$A", env) == "x-x--d-d--$A"


def test_gateway_precedence_follows_faas_cli() -> None:
    assert resolve_gateway(None, None, {}) == "http://127.0.0.1:8080"
    assert (
        resolve_gateway(None, "http://yaml:8080", {"OPENFAAS_URL": "env:1"}) == "http://yaml:8080"
    )
    assert resolve_gateway("HTTP://Flag:9/", "http://yaml:8080", {}) == "http://flag:9"
    assert (
        resolve_gateway("http://127.0.0.1:8080", None, {"OPENFAAS_URL": "gw:31112"})
        == "http://gw:31112"
    )


def test_image_repository_drops_tag_and_digest_but_keeps_registry_port() -> None:
    assert image_repository("ghcr.io/a/b:1.0") == "ghcr.io/a/b"
    assert image_repository("localhost:5000/b") == "localhost:5000/b"
    assert image_repository("localhost:5000/b:2@sha256:abc") == "localhost:5000/b"

"""The repository's stack files (stack.yml, the functions users deploy; stack.platform.yml, the
platform's own) against the OpenFaaS stack schema, the template they need, and the split
between them: `faas-cli deploy -f stack.yml` on Kubernetes must not deploy an `aggregator` over
the one the Helm chart made."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from core.stackfile import PLATFORM_STACK, load_stack

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "runtime" / "stack.schema.json").read_text())


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


STACK_FILES = ("stack.yml", "stack.platform.yml")


@pytest.mark.parametrize("name", STACK_FILES)
def test_repo_stack_files_match_the_openfaas_schema(name: str) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(yaml.safe_load((REPO / name).read_text()))


def test_platform_functions_are_not_in_the_stack_users_deploy() -> None:
    users = load_stack(REPO / "stack.yml").functions
    platform = load_stack(PLATFORM_STACK).functions
    assert PLATFORM_STACK == REPO / "stack.platform.yml"
    assert "aggregator" in platform and "aggregator" not in users
    assert not set(users) & set(platform), "a function in both stack files"
    # the chart deploys the aggregator under the name and image the platform stack gives it
    values = yaml.safe_load((REPO / "charts" / "fedfaas" / "values.yaml").read_text())
    assert values["aggregator"]["name"] == "aggregator"
    assert (
        platform["aggregator"]
        .image.split(":")[0]
        .endswith(values["aggregator"]["image"]["repository"].split("/", 1)[1])
    )


@pytest.mark.parametrize(
    "doc",
    [
        {"provider": {"name": "faas"}, "functions": {"f": {"image": "i", "fprocess": "x"}}},
        {
            "provider": {"name": "openfaas"},
            "functions": {"Bad_Name": {"image": "i", "fprocess": "x"}},
        },
        {"provider": {"name": "openfaas"}, "functions": {"f": {"fprocess": "x"}}},
        {
            "provider": {"name": "openfaas"},
            "functions": {"f": {"image": "i", "fprocess": "x", "limits": {"memory": "lots"}}},
        },
        {
            "provider": {"name": "openfaas"},
            "functions": {"f": {"image": "i", "fprocess": "x", "environment": {"a": 1}}},
        },
        {
            "version": "2.0",
            "provider": {"name": "openfaas"},
            "functions": {"f": {"image": "i", "fprocess": "x"}},
        },
    ],
)
def test_schema_rejects_what_faas_cli_would_reject(doc: dict[str, object]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)


@pytest.mark.parametrize("name", STACK_FILES)
def test_every_function_has_its_template_handler_and_a_supported_lang(name: str) -> None:
    stack = load_stack(REPO / name)
    assert stack.functions, f"{name} lists no functions"
    for fn in stack.functions.values():
        template = yaml.safe_load((REPO / "template" / fn.lang / "template.yml").read_text())
        assert template["language"] == fn.lang
        assert template["fprocess"] == "python index.py"
        assert fn.deployment()["envProcess"]
        assert fn.handler_dir is not None and (fn.handler_dir / "handler.py").is_file()
        assert fn.lang in ("python3-http", "python3-http-debian")
        for key in ("read_timeout", "write_timeout", "exec_timeout"):
            assert key in fn.environment, f"{fn.name}: raise {key} for large bodies"


@pytest.mark.parametrize("name", STACK_FILES)
def test_stack_copy_paths_exist_for_the_docker_build(name: str) -> None:
    stack = load_stack(REPO / name)
    for path in stack.copy:
        assert (REPO / path).exists(), path
    dockerfile = (REPO / "template" / "python3-http" / "Dockerfile").read_text()
    assert "of-watchdog" in dockerfile and 'mode="http"' in dockerfile

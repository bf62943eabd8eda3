"""The repository's stack.yml against the OpenFaaS stack schema, and the template it needs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from fedfaas.stackfile import load_stack

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "fedfaas" / "runtime" / "stack.schema.json").read_text())


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_repo_stack_yml_matches_the_openfaas_schema() -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(
        yaml.safe_load((REPO / "stack.yml").read_text())
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


def test_every_function_has_its_template_handler_and_a_supported_lang() -> None:
    stack = load_stack(REPO / "stack.yml")
    assert stack.functions, "stack.yml lists no functions"
    for fn in stack.functions.values():
        template = yaml.safe_load((REPO / "template" / fn.lang / "template.yml").read_text())
        assert template["language"] == fn.lang
        assert template["fprocess"] == "python index.py"
        assert fn.deployment()["envProcess"]
        assert fn.handler_dir is not None and (fn.handler_dir / "handler.py").is_file()
        assert fn.lang in ("python3-http", "python3-http-debian")
        for key in ("read_timeout", "write_timeout", "exec_timeout"):
            assert key in fn.environment, f"{fn.name}: raise {key} for large bodies"


def test_stack_copy_paths_exist_for_the_docker_build() -> None:
    stack = load_stack(REPO / "stack.yml")
    for path in stack.copy:
        assert (REPO / path).exists(), path
    dockerfile = (REPO / "template" / "python3-http" / "Dockerfile").read_text()
    assert "of-watchdog" in dockerfile and 'mode="http"' in dockerfile

"""The components' READMEs hold to the code: their Python snippets run as written, and their
diagrams and shell blocks name routes, files and commands that exist.

The platform-wide pages (README.md, docs/) are tests/docs/test_docs.py's; the ``make`` commands
of every page are dry-run by tests/test_makefile.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from fastapi.routing import APIRoute

import bpf
from tests.auth.test_routes_need_credentials import _engine, _tokens, _tracker
from tests.docs.snippets import REPO, command_lines, snippet


def _run(name: str) -> dict[str, Any]:
    """Run the Python snippet ``name`` as written; its names afterwards."""
    s = snippet(name)
    assert s.lang == "python", name
    names: dict[str, Any] = {"__name__": f"snippet_{name.replace('-', '_')}"}
    exec(compile(s.text, f"{s.page.relative_to(REPO)}:{s.line}", "exec"), names)
    return names


def test_the_workloads_snippet_runs_and_multi_krum_flags_the_far_update() -> None:
    names = _run("workloads-multi-krum")
    result = names["result"]
    assert "evil" in result["flagged"] and "evil" not in result["selected"]
    json.dumps(result, allow_nan=False)  # strict JSON, as the README says
    req = names["req"]
    assert (req.update_rounds, req.global_versions) == ((7,), (6,))


def test_the_router_snippet_passes_a_frame_and_counts_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whichever backend this machine loads (eBPF as root with bcc, else userspace)."""
    names = _run("bpf-router")
    frame, ep = names["frame"], names["ep"]
    assert frame is not None and frame.kind is bpf.Kind.PARTIAL
    assert (frame.src, frame.job, frame.weight) == (ep.id, 1, 3.0)
    assert names["grant"].kind is bpf.Kind.GRANT
    said, sent = capsys.readouterr().out.splitlines()
    assert said.split()[0] == names["router"].mode in ("ebpf", "userspace")
    assert sent == "1"
    assert not Path(names["router"].socket_path).exists()  # stopped


def _routes(app: Any) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods}


def test_the_cache_engine_diagram_names_routes_that_exist(tmp_path: Path) -> None:
    text = snippet("cache-engine-paths").text
    assert "POST /v1/queries" in text and "/v1/acquire" in text
    tokens = _tokens(tmp_path)
    assert ("POST", "/v1/queries") in _routes(_tracker(tokens))
    assert ("POST", "/v1/acquire") in _routes(_engine(tokens))
    # the cache function's /run (functions/flstore/handler.py routes by path)
    from functions.flstore import handler

    assert "/function/flstore-cache-N/run" in text
    event = SimpleNamespace(method="POST", path="/run", body=b"{}", headers={}, query={})
    answer = handler.handle(event, SimpleNamespace(hostname="test"))
    body = answer["body"] if isinstance(answer["body"], dict) else json.loads(answer["body"])
    assert body.get("error") != "no_route", body


def test_the_chart_install_block_names_the_chart_and_the_stack_that_exist() -> None:
    lines = command_lines(snippet("chart-install").text)
    assert lines[0] == "make images"
    helm = next(line.split() for line in lines if line.startswith("helm "))
    assert helm[1:3] == ["upgrade", "--install"]
    assert helm[helm.index("--namespace") + 1] == "openfaas"
    chart = yaml.safe_load((REPO / helm[4] / "Chart.yaml").read_text())
    assert chart["name"] == helm[3] == "fedfaas"
    faas = next(line.split() for line in lines if line.startswith("faas-cli "))
    assert faas[1:] == ["deploy", "-f", "stack.yml"]
    assert (REPO / "stack.yml").is_file()


def test_the_chart_check_block_is_make_targets_only() -> None:
    """`make chart` is dry-run by tests/test_makefile.py and run by tests/platform/test_chart.py."""
    assert command_lines(snippet("chart-check").text) == ["make chart"]


def test_the_chart_k8s_block_runs_the_kubernetes_tests_through_make() -> None:
    """``make test-k8s`` builds the binaries (``k8s-binaries``) and runs tests/k8s, which holds
    the API-server test the section describes."""
    (line,) = [c for c in command_lines(snippet("chart-k8s").text) if not c.startswith("#")]
    assert line.startswith("FEDFAAS_OPENFAAS_BIN=<") and line.endswith("> make test-k8s")
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^test-k8s:(.*)\n\t(.*)$", makefile, flags=re.M)
    assert target and "k8s-binaries" in target.group(1) and "tests/k8s" in target.group(2)
    assert (REPO / "tests" / "k8s" / "test_chart_on_apiserver.py").is_file()


def test_the_faasd_block_names_files_and_commands_the_faasd_tests_use() -> None:
    """The steps tests/containers/test_faasd_platform.py takes, with the same files."""
    lines = command_lines(snippet("faasd-deploy").text)
    assert lines[0] == "make images && bash deploy/faasd/images.sh"
    assert (REPO / "deploy" / "faasd" / "images.sh").is_file()
    prepare = next(line.split() for line in lines if "prepare.py" in line)
    assert (REPO / prepare[2]).is_file()
    platform = (REPO / "tests" / "containers" / "test_faasd_platform.py").read_text()
    for line in lines:
        if line.startswith("faas-cli "):
            verb = line.split()[1:3] if line.split()[1] == "secret" else line.split()[1:2]
            if verb != ["login"]:  # the harness logs in through its own config folder
                assert ", ".join(f'"{v}"' for v in verb) in platform, line
    assert "fedfaas-function-token" in "\n".join(lines)

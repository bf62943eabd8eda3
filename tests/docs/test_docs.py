"""README.md and docs/ hold to the repository: every snippet is run by a test, every link and
path they name exists, every command they show parses, and what they list matches the code.

The snippets that need a platform run in ``tests/docs/test_job_snippets.py`` (slow tier); the
``make`` commands of every page are dry-run by ``tests/test_makefile.py``.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from client.sdk import submit_job
from control_plane.jobs import JobSpec
from control_plane.selection import SELECTIONS
from core.fedbuff import AsyncSpec
from core.robust import RULES, RobustRule
from core.server_opt import ServerOptimizer
from fedfaas.cli import build_parser
from flstore_workloads.registry import WORKLOADS
from tests.docs.snippets import REPO, TESTS, all_snippets, command_lines, pages, read, snippet

#: a backticked word that names a file or folder of the repository (a/b, a/b.py, a/)
REPO_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*/?)`")


def tracked_top_level() -> set[str]:
    """The repository's tracked top-level names (``.state`` and other run-time folders aside)."""
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return {line.split("/", 1)[0] for line in out.splitlines()}


def test_every_snippet_is_named_and_run_by_a_test() -> None:
    snippets = all_snippets()
    assert len(snippets) >= 15
    unnamed = [f"{s.page.name}:{s.line}" for s in snippets if s.name is None]
    assert not unnamed, f"blocks without <!-- snippet: NAME -->: {unnamed}"
    names = [s.name for s in snippets]
    assert len(names) == len(set(names)), "a snippet name is used twice"
    tests = "".join(p.read_text() for p in TESTS.glob("test_*.py"))
    tests += (REPO / "tests" / "test_makefile.py").read_text()
    unrun = [n for n in names if f'"{n}"' not in tests and n not in TESTS_BY_PREFIX]
    assert not unrun, f"snippets no test names: {unrun}"


#: snippets run as a family, by name prefix, in tests/docs/test_job_snippets.py
TESTS_BY_PREFIX = {f"flstore-{w}" for w in WORKLOADS}


def test_the_snippet_reader_reads_names_blocks_and_commands(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "text\n<!-- snippet: one -->\n```sh\nmake up   # start\ncurl -s a \\\n  -d b\n"
        "python - <<'EOF'\nprint(1)\nEOF\n```\n\n```json\n{}\n```\n"
    )
    first, second = read(page)
    assert (first.name, first.lang, first.line) == ("one", "sh", 3)
    assert command_lines(first.text) == ["make up", "curl -s a -d b", "python - <<'EOF'"]
    assert (second.name, second.lang, second.text) == (None, "json", "{}\n")


def test_links_between_pages_resolve() -> None:
    for page in pages():
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to {target} is broken"


def test_every_repository_path_named_exists() -> None:
    top = tracked_top_level()
    missing = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for path in REPO_PATH.findall(text):
            if "/" in path and path.split("/", 1)[0] in top and not (REPO / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing


def test_every_metric_named_exists_in_the_code() -> None:
    named = {m for page in pages() for m in re.findall(r"`(fedfaas_\w+)", page.read_text())}
    assert named
    code = "".join(
        p.read_text()
        for folder in ("gateway", "control_plane", "cache_engine", "request_tracker", "fedfaas")
        for p in (REPO / folder).rglob("*.py")
    )
    for metric in named:
        base = re.sub(r"_(total|count|sum|bucket)$", "", metric)
        assert base in code, f"metric {metric} is named in the docs but not in the code"


def fedfaas_commands() -> list[list[str]]:
    """The arguments of every ``.venv/bin/fedfaas`` command in a snippet."""
    found = []
    for s in all_snippets():
        for line in command_lines(s.text):
            if line.startswith(".venv/bin/fedfaas "):
                found.append(line.split()[1:])
    return found


def test_every_fedfaas_command_in_a_snippet_parses() -> None:
    commands = fedfaas_commands()
    assert ["up", "--with", "all"] in commands and ["down"] in commands
    parser = build_parser()
    for args in commands:
        parser.parse_args(args)  # an unknown command or flag exits 2


def test_the_platform_is_started_and_stopped_the_same_way_on_every_page() -> None:
    """The slow tests start the platform once for the README's, jobs.md's and operations.md's
    blocks: each must start and stop it with the same commands."""
    for name in ("readme-quick-start", "jobs-sdk-job", "operations-one-machine"):
        lines = command_lines(snippet(name).text)
        assert lines[0] == ".venv/bin/fedfaas up --with all", name
        assert lines[-1] == ".venv/bin/fedfaas down", name


def workload_sections() -> dict[str, str]:
    text = (REPO / "docs" / "flstore.md").read_text()
    parts = re.split(r"^### ([\w-]+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_flstore_page_documents_every_workload_and_its_parameters() -> None:
    sections = workload_sections()
    assert set(sections) == set(WORKLOADS)
    for name, body in sections.items():
        listed = re.search(r"Parameters:(.*?)\. Cost", body, re.S)
        assert listed, f"{name}: no 'Parameters: ... Cost' sentence"
        words = re.sub(r"\([^)]*\)", "", listed.group(1))
        params = dict(re.findall(r"`(\w+)`(\*?)", words))
        fields = WORKLOADS[name].params_model.model_fields
        assert set(params) == set(fields), name
        required = {k for k, f in fields.items() if f.is_required()}
        assert {k for k, star in params.items() if star} == required, name
        assert f"<!-- snippet: flstore-{name} -->" in body


def test_the_kubernetes_and_image_snippets_name_what_exists() -> None:
    """Extracted, not run here: ``make images`` is dry-run by tests/test_makefile.py, the chart
    is installed on a real API server by tests/k8s, and faas-cli deploys stack.yml for real in
    tests/openfaas/test_faas_cli.py and tests/containers; here each command's files, flags and
    namespace are held to the repository."""
    lines = command_lines(snippet("openfaas-kubernetes").text)
    helm = next(line.split() for line in lines if line.startswith("helm "))
    assert helm[1:3] == ["upgrade", "--install"] and helm[helm.index("-n") + 1] == "openfaas"
    chart = yaml.safe_load((REPO / helm[4] / "Chart.yaml").read_text())
    assert chart["name"] == helm[3] == "fedfaas"
    faas = next(line.split() for line in lines if line.startswith("faas-cli "))
    assert faas[1] == "deploy" and "--gateway" in faas
    stack = yaml.safe_load((REPO / faas[faas.index("-f") + 1]).read_text())
    assert stack["provider"]["name"] == "openfaas"
    assert '"deploy", "-f"' in (REPO / "tests/openfaas/test_faas_cli.py").read_text()
    images = command_lines(snippet("openfaas-images").text)
    assert images == ["make images"]


@pytest.mark.parametrize("name", ["readme-commands", "benchmarks-run"])
def test_make_snippets_hold_only_make_commands(name: str) -> None:
    """Their targets are dry-run by tests/test_makefile.py, which reads every page."""
    lines = command_lines(snippet(name).text)
    assert lines and all(line.startswith("make ") for line in lines)


def submit_job_spans() -> list[ast.Call]:
    """Every inline ``submit_job(..., name=value)`` of docs/jobs.md, parsed."""
    text = (REPO / "docs" / "jobs.md").read_text()
    spans = re.findall(r"`(submit_job\(\.\.\.,.*?\))`", text, flags=re.S)
    calls = [ast.parse(" ".join(span.split()), mode="eval").body for span in spans]
    assert all(isinstance(c, ast.Call) for c in calls)
    return [c for c in calls if isinstance(c, ast.Call) and c.keywords]


def test_every_job_option_shown_is_one_submit_job_takes_and_its_check_accepts() -> None:
    """docs/jobs.md's inline ``submit_job(..., option=value)`` examples: each option is an
    argument of ``client.sdk.submit_job`` and each value passes the check the platform makes
    of it (robust rules, server optimizers, FedBuff, selection, drop_flagged)."""
    checks: dict[str, Callable[[Any], object]] = {
        "aggregation": RobustRule.from_json,
        "server_opt": ServerOptimizer.from_json,
        "fedbuff": AsyncSpec.from_json,
        "selection": lambda v: SELECTIONS.index(v),
        "drop_flagged": lambda v: JobSpec("j", 1, 1, [], drop_flagged=v).validate(),
        "evaluator": lambda v: v["kind"] == "function" and v["function"],
        "goal": lambda v: v >= 1,
    }
    accepted = set(inspect.signature(submit_job).parameters)
    shown = set()
    for call in submit_job_spans():
        for kw in call.keywords:
            assert kw.arg in accepted, f"submit_job takes no {kw.arg}"
            assert checks[str(kw.arg)](ast.literal_eval(kw.value)) is not False, kw.arg
            shown.add(kw.arg)
    assert {"aggregation", "server_opt", "fedbuff", "selection", "drop_flagged"} <= shown


def test_the_rules_and_optimizers_listed_are_the_platforms() -> None:
    text = " ".join((REPO / "docs" / "jobs.md").read_text().split())
    rules = re.search(r"one of `median`(.*?)\. ", text)
    assert rules
    listed = {"median", *re.findall(r"`([\w-]+)`", rules.group(1))} - {"beta", "f", "m"}
    listed -= {"root_client"}
    assert listed | {"dp-fedavg"} == set(RULES)  # dp-fedavg has a section of its own
    opts = re.search(r"one of `fedavgm`(.*?)\(", text)
    assert opts
    names = {"fedavgm", *re.findall(r"`([\w-]+)`", opts.group(1))}
    for name in names:
        ServerOptimizer.from_json({"name": name})
    with pytest.raises(ValueError):
        ServerOptimizer.from_json({"name": "no-such-optimizer"})

"""Each function image installs what its code imports when it starts: the template's Dockerfile
installs the FedFaaS packages with ``pip install --no-deps``, so every third-party package that
importing the handler (and index.py's function token check) runs at module level must come from
the function's requirements.txt or the template's, or be a dependency of one of those.

Checked on this machine's installed metadata: the handler is imported in a child process, and the
module-level imports of every FedFaaS module it loaded are matched to distributions. Imports inside
functions (run later, e.g. minio on the first load) are not covered."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}

# imports the handler as index.py does (with the token module) and reports the loaded modules
PROBE = """
import importlib, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/functions"]
importlib.import_module("runtime.function_auth")
importlib.import_module(sys.argv[2] + ".handler")
print(json.dumps({n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}))
"""


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; (]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _requirements(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def installed_with(requirements: list[str]) -> set[str]:
    """Distributions ``pip install -r`` brings for ``requirements`` (their dependencies too, as
    this machine's metadata lists them; extras left out)."""
    seen: set[str] = set()
    todo = [_dist_name(r) for r in requirements]
    while todo:
        dist = todo.pop()
        if not dist or dist in seen:
            continue
        seen.add(dist)
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_dist_name(r) for r in requires if "extra ==" not in r]
    return seen


def module_level_imports(function: str) -> dict[str, str]:
    """Third-party top-level module -> the FedFaaS module importing it at module level, for the
    modules that importing ``functions/<function>/handler.py`` loads."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO), function],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded: dict[str, str | None] = json.loads(out.stdout.splitlines()[-1])
    found: dict[str, str] = {}
    for name, file in sorted(loaded.items()):
        if name.split(".")[0] not in FIRST_PARTY | {function} or not (file or "").endswith(".py"):
            continue
        for node in ast.parse(Path(str(file)).read_text()).body:
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top not in sys.stdlib_module_names | FIRST_PARTY | {"__future__", function}:
                    found.setdefault(top, name)
    return found


def _missing_for(function: str) -> list[str]:
    wanted = _requirements(REPO / "functions" / function / "requirements.txt")
    wanted += _requirements(REPO / "template" / "python3-http" / "requirements.txt")
    available = installed_with(wanted)
    dists = metadata.packages_distributions()
    return [
        f"{module} (imported by {by})"
        for module, by in module_level_imports(function).items()
        if not any(_dist_name(d) in available for d in dists.get(module, [module]))
    ]


def test_the_probe_sees_what_a_handler_imports() -> None:
    imports = module_level_imports("flstore")
    assert {"numpy", "safetensors", "pydantic"} <= set(imports)  # handler, cache_engine
    assert imports["sklearn"] == "flstore_workloads.clustering"  # through flstore_workloads
    assert module_level_imports("echo") == {}  # the standard library only


@pytest.mark.parametrize(
    "function",
    [
        "echo",
        "aggregator",
        "flstore",
        "evaluator",
    ],
)
def test_function_requirements_cover_its_start_up_imports(function: str) -> None:
    assert not _missing_for(function), _missing_for(function)


def test_every_function_folder_is_checked() -> None:
    folders = {p.parent.name for p in (REPO / "functions").glob("*/handler.py")}
    assert folders == {"echo", "aggregator", "flstore", "evaluator"}

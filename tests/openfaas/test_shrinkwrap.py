"""`faas-cli build --shrinkwrap` on the repo's stack.yml: each function's build context (what
`docker build` would get) holds every path the template's Dockerfile COPYs and every FedFaaS
package the function's code imports, and the Dockerfile installs each of those packages.

faas-cli puts the handler folder in ``function/`` and the stack's ``configuration.copy`` entries
inside it too (``function/core``, ...), not at the context root. It runs in a copy of the repo,
so no ``build/`` is left in the repo."""

from __future__ import annotations

import ast
import fnmatch
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.openfaas.conftest import FaasCli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "python3-http"


def _first_party(name: str) -> bool:
    return (REPO / name / "__init__.py").is_file() or (REPO / f"{name}.py").is_file()


def _module_files(module: str) -> list[Path]:
    """The repo files that importing ``module`` (``a.b.c``) runs: package inits and the module."""
    parts = module.split(".")
    files = []
    for i in range(1, len(parts) + 1):
        base = REPO.joinpath(*parts[:i])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
    return files


def _imports(path: Path, package: str | None) -> set[str]:
    """Absolute module names ``path`` imports (relative ones resolved against ``package``;
    ``None``: a handler's own modules, whose relative imports stay inside the handler)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                base = node.module
            elif package is not None:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            else:
                continue
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def first_party_packages(sources: list[Path]) -> set[str]:
    """Top-level FedFaaS packages that ``sources`` import, directly or through each other."""
    seen_modules: set[str] = set()
    todo = {m for src in sources for m in _imports(src, None)}
    while todo:
        module = todo.pop()
        if module in seen_modules or not _first_party(module.split(".")[0]):
            continue
        seen_modules.add(module)
        for file in _module_files(module):
            # a/b/__init__.py and a/b/c.py both resolve relative imports against a.b
            package = ".".join(file.relative_to(REPO).parts[:-1])
            todo |= _imports(file, package or None) - seen_modules
    return {m.split(".")[0] for m in seen_modules}


def dockerfile_copies(dockerfile: Path) -> list[str]:
    """Sources of the Dockerfile's ``COPY`` lines from the build context (not ``--from=``)."""
    sources = []
    for line in dockerfile.read_text().replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        args = words[1:]
        if any(a.startswith("--from=") for a in args):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources += paths[:-1]
    return sources


def _installed_packages(dockerfile: Path) -> set[str]:
    """Top-level packages a COPY puts in their own folder (``COPY function/core
    ./src/core``), as the library's ``pip install ./src`` needs; ``COPY function/ .`` (the
    handler folder) makes none importable."""
    return {
        Path(s.rstrip("/")).name
        for s in dockerfile_copies(dockerfile)
        if s.rstrip("/") not in ("function", ".")
    }


def _stack_with_every_function(src: Path) -> dict[str, str]:
    """The repo's stack.yml, plus an entry for each ``functions/<name>`` folder it lacks (as a
    user building that function's image would add), written back; name -> handler folder."""
    stack = yaml.safe_load(src.read_text())
    handlers = {name: fn["handler"] for name, fn in stack["functions"].items()}
    for folder in sorted((src.parent / "functions").iterdir()):
        if (
            folder / "handler.py"
        ).is_file() and f"./functions/{folder.name}" not in handlers.values():
            stack["functions"][folder.name] = {
                "lang": TEMPLATE,
                "handler": f"./functions/{folder.name}",
                "image": f"fedfaas-conformance/{folder.name}:0.1.0",
            }
            handlers[folder.name] = f"./functions/{folder.name}"
    src.write_text(yaml.safe_dump(stack, sort_keys=False))
    return handlers


def test_shrinkwrapped_contexts_hold_what_the_dockerfile_copies_and_the_code_imports(
    faas_cli: FaasCli, tmp_path: Path
) -> None:
    tree = tmp_path / "repo"
    shutil.copytree(
        REPO, tree, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc", "build", "tests")
    )
    handlers = _stack_with_every_function(tree / "stack.yml")
    assert {"echo", "aggregator"} <= set(handlers)

    had_build = (REPO / "build").exists()
    said = faas_cli.ok("build", "--shrinkwrap", "-f", "stack.yml", cwd=tree)
    assert (REPO / "build").exists() == had_build  # the repo is untouched

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    problems = []
    for name, handler in handlers.items():
        context = tree / "build" / name
        assert f"{name} shrink-wrapped to build/{name}" in said, said
        dockerfile = context / "Dockerfile"
        assert dockerfile.read_text() == (REPO / f"template/{TEMPLATE}/Dockerfile").read_text()
        for source in dockerfile_copies(dockerfile):
            if not (context / source).exists():
                problems.append(f"{name}: the Dockerfile copies {source!r}, not in build/{name}/")

        own = list((tree / handler).rglob("*.py"))  # handler modules and tests
        needed = first_party_packages([context / "index.py", *own])
        assert "runtime" in needed  # index.py's function token check at least
        if name == "flstore":  # through its handler: `from cache_engine.cold_store import ...`
            assert "cache_engine" in needed
        installed = _installed_packages(dockerfile)
        for package in sorted(needed):
            where = [p for p in (context / package, context / "function" / package) if p.is_dir()]
            if not where:
                problems.append(f"{name}: imports {package!r}, not in build/{name}/")
            if package not in installed:
                problems.append(
                    f"{name}: imports {package!r}, which the Dockerfile does not install"
                )
            if not any(fnmatch.fnmatch(package, pattern) for pattern in include):
                problems.append(
                    f"{name}: pip install ./src leaves out {package!r} (pyproject.toml)"
                )
    assert not problems, "\n".join(problems)

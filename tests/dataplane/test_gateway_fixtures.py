"""The gateway fixtures of :mod:`tests.dataplane.gateways` stay importable: every module that
imports a fixture from there has, beside it, every fixture of that module the imported one
depends on (imported from there too, or a fixture of its own of that name, as tests/tls's
``gateway_extra``), and no module imports fixtures from tests/dataplane/conftest.py.

Twice a fixture of the shared gateway fixtures gained a dependency and the tests that imported it
by name from another folder errored with "fixture 'gateway_extra' not found" (6550e9e, 54c30dc).
This fails at the change instead, whoever runs it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = "tests.dataplane.gateways"


def _fixtures(tree: ast.Module) -> dict[str, list[str]]:
    """The module's fixtures (functions decorated ``pytest.fixture``) and their argument names."""
    found: dict[str, list[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            if ast.unparse(target) in ("pytest.fixture", "fixture"):
                found[node.name] = [a.arg for a in node.args.args]
    return found


def _imported_from(tree: ast.Module, module: str) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    }


def _needs(name: str, shared: dict[str, list[str]]) -> set[str]:
    """``name`` and the fixtures of the shared module it depends on, transitively."""
    todo, seen = [name], set()
    while todo:
        current = todo.pop()
        if current in seen or current not in shared:
            continue
        seen.add(current)
        todo.extend(shared[current])
    return seen


def _python_files() -> list[Path]:
    return sorted(
        p
        for top in ("tests", "functions")
        for p in (REPO / top).rglob("*.py")
        if ".venv" not in p.parts and "node_modules" not in p.parts
    )


def test_the_shared_module_defines_the_fixtures_it_is_imported_for() -> None:
    shared = _fixtures(ast.parse((REPO / "tests/dataplane/gateways.py").read_text()))
    assert {"gateway_extra", "make_gw", "checkpoints_to"} <= shared.keys()
    assert "gateway_extra" in shared["make_gw"]


def test_every_importer_of_a_gateway_fixture_has_its_dependencies_beside_it() -> None:
    shared = _fixtures(ast.parse((REPO / "tests/dataplane/gateways.py").read_text()))
    importers = 0
    missing: dict[str, set[str]] = {}
    for path in _python_files():
        tree = ast.parse(path.read_text())
        imported = _imported_from(tree, SHARED) & shared.keys()
        if not imported:
            continue
        importers += 1
        have = imported | _fixtures(tree).keys()
        needed = set().union(*(_needs(name, shared) for name in imported))
        if needed - have:
            missing[str(path.relative_to(REPO))] = needed - have
    # the package's conftest, tests/tls, tests/secagg, tests/flstore
    assert importers >= 4, importers
    assert not missing, f"import these from {SHARED} beside the fixtures that need them: {missing}"


def test_no_module_imports_the_data_plane_conftest() -> None:
    offenders = [
        str(path.relative_to(REPO))
        for path in _python_files()
        if _imported_from(ast.parse(path.read_text()), "tests.dataplane.conftest")
    ]
    assert not offenders, f"import the gateway fixtures from {SHARED}: {offenders}"

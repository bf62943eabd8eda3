"""Import circles among FedFaaS's own modules, from their source (nothing is imported).

    python scripts/import_cycles.py [--root DIR] [--all]

Builds the graph "module A imports module B" over the first-party packages under the root
(the folders holding an ``__init__.py``; tests, build outputs and the venv left out), from every
``import`` and ``from ... import`` in each module, at any depth (an import inside a function
still ties the two modules). ``from pkg import name`` counts as importing ``pkg.name`` when
that is a module, else ``pkg``. Prints each strongly connected component of more than one
module (an import circle: each of its modules reaches every other), the largest first, and a
summary line ``cycles: N components, M modules``. ``--all`` also lists the edges inside each
component; ``--runtime`` leaves out the imports under ``if TYPE_CHECKING:`` (for the type
checker only: they tie the modules' types, not their loading). Exit status 0 either way: it measures (issue 38 asks for the count before and after
the layout work), ``make lint``'s import contracts enforce.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

SKIP = {"tests", "build", ".venv", "node_modules", ".git"}


def packages(root: Path) -> list[str]:
    """First-party top-level packages under ``root``."""
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and p.name not in SKIP and (p / "__init__.py").is_file()
    )


def modules(root: Path, tops: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the packages ``tops``."""
    out: dict[str, Path] = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            if SKIP & set(path.relative_to(root).parts):
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _nodes(tree: ast.AST, runtime: bool) -> Iterable[ast.AST]:
    """Every node of ``tree``; with ``runtime``, none under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if runtime and _type_checking(child):
                todo += getattr(child, "orelse", [])
                continue
            todo.append(child)


def imports_of(module: str, path: Path, known: dict[str, Path], runtime: bool = False) -> set[str]:
    """The first-party modules ``module`` imports (itself left out); with ``runtime``, only
    the imports that run (those under ``if TYPE_CHECKING:`` are for the type checker)."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(), str(path)), runtime):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base_parts = here[: len(here) - (node.level - 1)] if node.level else []
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
            for alias in node.names:  # a submodule, else a name defined in ``base``
                full = f"{base}.{alias.name}" if base else alias.name
                names.append(full if full in known else base)
        for name in names:
            target = _resolve(name, known) if name else None
            if target and target != module:
                found.add(target)
    return found


def graph(root: Path, runtime: bool = False) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports (``runtime``: :func:`imports_of`)."""
    known = modules(root, packages(root))
    return {m: imports_of(m, p, known, runtime) for m, p in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, largest first (Tarjan's
    algorithm, iterative: the graph is deep enough to exhaust Python's recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--all", action="store_true", help="list the edges inside each cycle")
    parser.add_argument(
        "--runtime", action="store_true", help="leave out imports under `if TYPE_CHECKING:`"
    )
    args = parser.parse_args(argv)
    edges = graph(args.root, args.runtime)
    found = cycles(edges)
    for component in found:
        print(f"{len(component)} modules: {' '.join(component)}")
        if args.all:
            members = set(component)
            for m in component:
                for t in sorted(edges[m] & members):
                    print(f"    {m} -> {t}")
    print(f"cycles: {len(found)} components, {sum(map(len, found))} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())

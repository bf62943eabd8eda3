"""Each function image installs what its code imports: the template's Dockerfile installs the
FedFaaS packages it copies (stack files' ``configuration.copy``, its ``COPY function/<pkg>
./src/<pkg>`` lines) with ``pip install --no-deps``, so every third-party package that code
imports must come from the function's requirements.txt or the template's, or be a dependency
of one of those.

Read from the sources, not run: from the image's own modules (the template's index.py and every
module of the function's folder, its handler_test.py too, which the build runs), every import
statement, at module level or inside a function (``cache_engine.evaluators`` imports
``core.tls``, and through it pydantic, only when it calls a function over https: d556d7b broke
the digits-evaluator image so), is followed into the FedFaaS modules it names, transitively.
An import under ``if TYPE_CHECKING`` never runs; one in a ``try`` that catches ImportError is
the code's own fallback. The FedFaaS functions whose imports an image never runs (another
part's, or a setting it is not built for) are listed in :data:`NOT_RUN`, each with its reason;
every other miss fails. Third-party imports are matched to distributions with this machine's
installed metadata."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template" / "python3-http"
STACKS = ("stack.yml", "stack.platform.yml")
FIRST_PARTY = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
#: the template's test step installs pytest for the handler tests it runs (its own folder)
TEST_STEP = {"pytest"}

_MINTING = "mints the platform's CA and certificates (cryptography); a function only verifies"
_TORCH_EVALUATOR = (
    "the in-process evaluator kind digits-softmax, for the embedded runtime (PyTorch, which no "
    "image installs: gigabytes of CUDA libraries)"
)
_TORCH_OBJECTS = "torch views of objects: the torch kernel and torch evaluators"
_SHARED = {
    "core.tls.mint_ca": _MINTING,
    "core.tls.mint_cert": _MINTING,
    "core.tls._write_pair": _MINTING,
}
_COLD_STORE = "FLStore's cold store (MinIO); the evaluator is sent the models it scores"

#: function -> the FedFaaS functions (``module.qualified_name``, a class: its methods) whose
#: imports its image never runs, and why: they serve another part, or a setting the image is not
#: built for. Each must still be met on the way (test_every_not_run_entry_is_still_met).
NOT_RUN: dict[str, dict[str, str]] = {
    "aggregator": {
        "function.handler._boot": "FEDFAAS_AGGREGATOR_KERNEL=torch only (its requirements say)",
        "core.fedavg.as_tensor": "the torch kernel's",
        "core.fedavg.accumulate": "the torch kernel's branch",
        "core.fedavg.add_into": "the torch kernel's branch",
        "core.fedavg.finalize": "the torch kernel's branch",
        "core.objstore.client.MappedObject.tensor": _TORCH_OBJECTS,
        "bpf.loader.SidecarProgram": "bcc (a Debian package): loaded only where bpf.probe could "
        "import bcc (try/except ImportError), on the node gateway",
        "bpf.prometheus.RouterCollector": "the node gateway's metrics of its router",
    },
    "flstore": {
        **_SHARED,
        "flstore_workloads.evaluation._torch": _TORCH_EVALUATOR,
        "core.objstore.client.MappedObject.tensor": _TORCH_OBJECTS,
    },
    "digits-evaluator": {
        **_SHARED,
        "cache_engine.cold_store.MinioColdStore": _COLD_STORE,
        "cache_engine.cold_store.object_path": _COLD_STORE,
        "cache_engine.evaluator_function.torch_logits": "a user's own PyTorch classifier (the "
        "handler's docstring says to add torch to its requirements); this one is numpy",
        "client.node._body": "torch state dicts a client sends; the evaluator reads client.data",
    },
}


@dataclass(frozen=True)
class Image:
    """What a function's image holds of FedFaaS code: its folder and the packages installed."""

    function: str
    handler: Path
    packages: frozenset[str]


def _dockerfile_packages() -> set[str]:
    """The FedFaaS packages the template's Dockerfile installs (``COPY function/<p> ./src/<p>``)."""
    text = (TEMPLATE / "Dockerfile").read_text()
    return set(re.findall(r"^COPY\b.*\sfunction/(\w+) \./src/\1$", text, re.MULTILINE))


def images() -> dict[str, Image]:
    """Every function of the stack files, as ``make images`` builds it."""
    installed = _dockerfile_packages()
    out: dict[str, Image] = {}
    for stack_file in STACKS:
        stack = yaml.safe_load((REPO / stack_file).read_text())
        copied = {Path(c).name for c in stack["configuration"]["copy"]}
        for name, spec in stack["functions"].items():
            assert spec["lang"] == TEMPLATE.name, f"{stack_file}: {name} is not built from it"
            out[name] = Image(name, REPO / spec["handler"], frozenset(copied & installed))
    return out


@dataclass(frozen=True)
class Use:
    """One import statement's module, where it is, and the function it runs in ("" at module
    level; a class body runs at module level too)."""

    module: str
    by: str
    line: int
    scope: str = ""

    def where(self) -> str:
        return f"{self.by}:{self.line}" + (f" (in {self.scope})" if self.scope else "")


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    """Whether one of a ``try``'s handlers catches ImportError (a bare ``except`` does)."""
    for handler in handlers:
        if handler.type is None:
            return True
        caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names = {t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in caught}
        if names & {"ImportError", "ModuleNotFoundError"}:
            return True
    return False


def imports_of(path: Path, module: str, package: str) -> list[Use]:
    """Every import statement of ``path`` (module ``module`` of ``package``), those inside
    functions too; ``from a import b`` names both ``a`` and ``a.b`` (``b`` may be a module)."""
    found: list[Use] = []

    def statements(body: list[ast.stmt] | list[ast.ExceptHandler], qual: str, fn: str) -> None:
        for node in body:
            statement(node, qual, fn)

    def statement(node: ast.AST, qual: str, fn: str) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            statements(node.orelse, qual, fn)
            return
        if isinstance(node, ast.Try) and _catches_import_error(node.handlers):
            for part in (node.handlers, node.orelse, node.finalbody):
                statements(part, qual, fn)
            return
        if isinstance(node, ast.Import):
            found.extend(Use(a.name, module, node.lineno, fn) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            else:
                base = str(node.module)
            found.append(Use(base, module, node.lineno, fn))
            found.extend(Use(f"{base}.{a.name}", module, node.lineno, fn) for a in node.names)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            qual = ".".join(filter(None, [qual, getattr(node, "name", "<lambda>")]))
            if not isinstance(node, ast.ClassDef):
                fn = qual
        for child in ast.iter_child_nodes(node):
            statement(child, qual, fn)

    statements(ast.parse(path.read_text(), str(path)).body, "", "")
    return found


def _files(image: Image, module: str) -> list[Path] | None:
    """The files importing ``module`` runs in ``image`` (package inits and the module; none for
    a name no file holds, an attribute: ``from a import name``), or None when the image holds
    no such top-level package."""
    parts = module.split(".")
    if module == "index":
        return [TEMPLATE / "index.py"]
    if parts[0] == "function":
        root, parts = image.handler, parts[1:]
        files = [f for f in [image.handler / "__init__.py"] if f.is_file()]
    elif parts[0] in image.packages:
        root, files = REPO, []
    else:
        return None
    for i in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:i])
        files += [f for f in (base / "__init__.py", base.with_suffix(".py")) if f.is_file()]
    return files


def _module_of(image: Image, file: Path) -> tuple[str, str]:
    """(module, package) of one of ``image``'s files."""
    if file == TEMPLATE / "index.py":
        return "index", ""
    inside = file.is_relative_to(image.handler)
    parts = ["function"] * inside + list(file.relative_to(image.handler if inside else REPO).parts)
    parts[-1] = parts[-1].removesuffix(".py")
    package = ".".join(parts[:-1])
    return (package if parts[-1] == "__init__" else ".".join(parts)), package


@dataclass
class Reach:
    """What an image's code imports, followed from its own modules through FedFaaS's."""

    third_party: dict[str, list[Use]]  # top-level module -> the imports of it reached
    absent: list[Use]  # imports of FedFaaS packages the image does not hold
    not_run: set[str]  # NOT_RUN entries of the image met on the way
    first: dict[str, Use] = field(default_factory=dict)  # FedFaaS module -> what first imported it

    def chain(self, use: Use) -> str:
        """``use`` and the imports that led to it, back to the image's own modules."""
        said, by = [use.where()], use.by
        while by in self.first and self.first[by].line:
            said.append(self.first[by].where())
            by = self.first[by].by
        return " <- ".join(said)


def reach(image: Image) -> Reach:
    skip = NOT_RUN.get(image.function, {})
    todo = [Use("index", "the template", 0)]
    todo += [
        Use(_module_of(image, p)[0], "the image", 0) for p in sorted(image.handler.rglob("*.py"))
    ]
    seen: set[Path] = set()
    out = Reach({}, [], set())
    while todo:
        use = todo.pop(0)
        top = use.module.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        where = f"{use.by}.{use.scope}"
        excused = [k for k in skip if use.scope and (where == k or where.startswith(k + "."))]
        if excused:
            out.not_run.update(excused)
            continue
        files = _files(image, use.module)
        if files is None:
            if top in FIRST_PARTY:
                out.absent.append(use)
            elif not (top in TEST_STEP and use.by.endswith("_test")):
                out.third_party.setdefault(top, []).append(use)
            continue
        for file in files:
            if file not in seen:
                seen.add(file)
                module, package = _module_of(image, file)
                out.first.setdefault(module, use)
                todo += imports_of(file, module, package)
    return out


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


def missing(image: Image, requirements: list[str]) -> list[str]:
    """What ``image``'s code imports and neither ``requirements`` nor the template's bring."""
    available = installed_with(requirements + _requirements(TEMPLATE / "requirements.txt"))
    dists = metadata.packages_distributions()
    reached = reach(image)
    found = [f"{u.module} (not in the image): {reached.chain(u)}" for u in reached.absent]
    for module, uses in sorted(reached.third_party.items()):
        if not any(_dist_name(d) in available for d in dists.get(module, [module])):
            found += [f"{module}: {reached.chain(u)}" for u in uses]
    return list(dict.fromkeys(found))


def _own_requirements(image: Image) -> list[str]:
    return _requirements(image.handler / "requirements.txt")


def test_every_function_folder_is_built_and_checked() -> None:
    built = images()
    assert set(built) == {"echo", "digits-evaluator", "aggregator", "flstore"}
    folders = {p.parent for p in (REPO / "functions").glob("*/handler.py")}
    assert {image.handler for image in built.values()} == folders
    assert _dockerfile_packages() == {
        "core",
        "runtime",
        "flstore_workloads",
        "bpf",
        "cache_engine",
        "client",
    }
    assert all(image.packages == _dockerfile_packages() for image in built.values())
    # the test step that runs handler_test.py brings its own pytest
    assert re.search(
        r"pip install .*--target /tmp/pytest pytest\b", (TEMPLATE / "Dockerfile").read_text()
    )


def test_imports_inside_functions_are_followed_into_fedfaas_modules() -> None:
    reached = reach(images()["digits-evaluator"])
    assert not reached.absent
    # d556d7b: cache_engine.evaluators imports core.tls inside _function; core.tls pydantic
    said = [reached.chain(u) for u in reached.third_party["pydantic"]]
    assert any(
        "core.tls:" in c and "cache_engine.evaluators:" in c and "(in _function)" in c for c in said
    ), said
    assert "pytest" not in reached.third_party  # the test step's own
    flstore = reach(images()["flstore"]).third_party
    assert any(u.by == "flstore_workloads.clustering" for u in flstore["sklearn"])
    assert set(reach(images()["echo"]).third_party) == {"flask", "waitress"}  # index.py's


def test_the_digits_evaluator_without_pydantic_is_caught() -> None:
    """d556d7b's miss, with the requirements as they were before d8f0442."""
    image = images()["digits-evaluator"]
    without = [r for r in _own_requirements(image) if _dist_name(r) != "pydantic"]
    assert len(without) == len(_own_requirements(image)) - 1
    said = [s for s in missing(image, without) if s.startswith("pydantic: ")]
    assert said and all("core.tls:" in s for s in said), said
    assert not missing(image, _own_requirements(image))


def test_what_runs_is_told_from_what_never_does(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import a\n"
        "if TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "try:\n    import d\nexcept ImportError:\n    import e\n"
        "try:\n    import f\nexcept OSError:\n    pass\n"
        "class K:\n    import g\n    def m(self):\n        from .h import i\n"
        "def fn():\n    return lambda: __import__('j')\n"
    )
    found = {(u.module, u.scope) for u in imports_of(tmp_path / "m.py", "p.m", "p")}
    assert found == {
        ("typing", ""),
        ("typing.TYPE_CHECKING", ""),
        ("a", ""),
        ("c", ""),
        ("e", ""),
        ("f", ""),
        ("g", ""),
        ("p.h", "K.m"),
        ("p.h.i", "K.m"),
    }


def test_a_fedfaas_package_the_image_does_not_hold_is_caught(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text("def handle(event, context):\n    import gateway.app\n")
    image = Image("echo", tmp_path, images()["echo"].packages)
    assert missing(image, []) == ["gateway.app (not in the image): function.handler:2 (in handle)"]


def test_every_not_run_entry_is_still_met() -> None:
    for function, entries in NOT_RUN.items():
        met = reach(images()[function]).not_run
        assert set(entries) == met, f"{function}: never met: {sorted(set(entries) - met)}"


@pytest.mark.parametrize("function", ["echo", "digits-evaluator", "aggregator", "flstore"])
def test_function_requirements_cover_everything_its_image_imports(function: str) -> None:
    image = images()[function]
    said = missing(image, _own_requirements(image))
    assert not said, "\n".join(said)

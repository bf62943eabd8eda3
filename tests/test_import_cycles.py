"""scripts/import_cycles.py: the import circles among first-party modules, from their source."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "import_cycles.py"
_spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
assert _spec and _spec.loader
ic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ic)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_circles_of_every_import_form_are_found_and_a_layered_package_has_none(tmp_path):
    root = _tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/wire.py": "import json\n",
            "app/__init__.py": "from app.api import build\n",
            "app/api.py": "from core import wire\nfrom . import state\n",
            "app/state.py": "def f():\n    from app.api import build  # inside a function\n",
            "app/rounds.py": "from .state import f\n",
            "tests/__init__.py": "",
            "tests/test_x.py": "import app.rounds\nimport app.api\n",
        },
    )
    edges = ic.graph(root)
    assert edges["app.api"] == {"core.wire", "app.state"}
    assert edges["app.rounds"] == {"app.state"}
    assert "tests.test_x" not in edges  # tests are no part of the layout
    assert ic.cycles(edges) == [["app.api", "app.state"]]  # app/__init__ is imported by none
    assert ic.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    # a type-only import ties the types, not the loading
    (root / "app" / "state.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.api import build\n"
        "else:\n    import core.wire\n"
    )
    assert ic.cycles(ic.graph(root)) == [["app.api", "app.state"]]
    assert ic.graph(root, runtime=True)["app.state"] == {"core.wire"}
    assert ic.cycles(ic.graph(root, runtime=True)) == []


def test_the_script_prints_a_summary_line_for_this_repository():
    out = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.splitlines()[-1].startswith("cycles: ")


def test_the_repository_has_no_import_circle_not_even_through_type_only_imports():
    """The gateway's parts depend on the node protocol (``gateway.node``), never on
    ``gateway.core``, which assembles them; the cache engine's parts on its state
    (``cache_engine.state``, with the part planner behind its ``Parts`` protocol), never on
    ``cache_engine.engine`` (issue 38)."""
    assert ic.cycles(ic.graph(ROOT)) == []

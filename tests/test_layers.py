"""The layering contracts in pyproject.toml (``[tool.importlinter]``, run by ``make lint``):
they hold on the repository, they cover every module of the FL core, and an upward import
breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LINT = Path(sys.executable).with_name("lint-imports")
#: the product shell: everything in fedfaas/ (the core and the components live elsewhere)
SHELL = {"cli", "platform", "demo", "deploy", "provision_minio", "settings"}
#: every top-level Python package of the repository that the layers cover
LAYERED = {
    "core",
    "flstore_workloads",
    "runtime",
    "gateway",
    "cache_engine",
    "control_plane",
    "request_tracker",
    "bpf",
    "client",
    "fedfaas",
    "console",
}


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(cwd / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)},
    )


def test_the_repository_keeps_its_layering_contracts():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(CONFIG['contracts'])} kept, 0 broken" in res.stdout


def test_the_layers_cover_every_package_and_fedfaas_holds_only_the_shell():
    """A new top-level package, or a new module in the product shell's folder, cannot be left
    out of the layering without this failing."""
    packages = {
        p.name
        for p in ROOT.iterdir()
        if (p / "__init__.py").is_file() and p.name not in {"tests", "bench", "functions"}
    }
    assert packages == LAYERED
    layers = next(c for c in CONFIG["contracts"] if c["name"] == "FedFaaS's layers")
    listed = {m.strip() for layer in layers["layers"] for m in layer.replace(":", "|").split("|")}
    assert listed == LAYERED
    assert layers["layers"][0] == "fedfaas" and layers["layers"][-1] == "core"
    shell = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "fedfaas").iterdir()
        if (p.suffix == ".py" and p.stem not in {"__init__", "__main__"})
        or (p.is_dir() and (p / "__init__.py").is_file())
    }
    assert shell == SHELL


def _copy(tmp_path: Path) -> Path:
    """The packages and the contracts, copied to ``tmp_path`` (kept there)."""
    for package in CONFIG["root_packages"]:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("results", "__pycache__", "*.json", "*.png"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    assert _lint(tmp_path).returncode == 0
    return tmp_path


def test_an_upward_import_breaks_the_contracts(tmp_path):
    _copy(tmp_path)
    wire = tmp_path / "core" / "wire" / "layout.py"
    wire.write_text(wire.read_text() + "\nfrom gateway.settings import GatewaySettings  # noqa\n")
    res = _lint(tmp_path)
    assert res.returncode != 0
    assert "FedFaaS's layers BROKEN" in res.stdout
    assert "core.wire.layout -> gateway.settings" in res.stdout


def test_the_gateway_layers_cover_every_gateway_module():
    layers = next(c for c in CONFIG["contracts"] if c["name"] == "The node gateway's layers")
    listed = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    modules = {f"gateway.{p.stem}" for p in (ROOT / "gateway").glob("*.py")}
    assert listed == modules - {"gateway.__init__"}


def test_an_upward_import_in_the_gateway_breaks_its_layers(tmp_path):
    """The round engine naming the gateway's type, even for the type checker alone: the import
    that tied every gateway module into one circle."""
    _copy(tmp_path)
    rounds = tmp_path / "gateway" / "rounds.py"
    rounds.write_text(
        rounds.read_text()
        + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from gateway.core import Gateway  # noqa\n"
    )
    res = _lint(tmp_path)
    assert res.returncode != 0
    assert "The node gateway's layers BROKEN" in res.stdout
    assert "gateway.rounds -> gateway.core" in res.stdout

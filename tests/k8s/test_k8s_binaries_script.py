"""scripts/k8s-binaries.sh and scripts/cert-manager-{crds,controller}.sh without building or
downloading anything: the version each fetches is the one the tests look for, what is cached is
not fetched again, and bad input is refused, named."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.k8s.cert_manager import VERSION as CM_VERSION
from tests.k8s.cluster import K8S_VERSION

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "k8s-binaries.sh"


def _run(*args: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, "FEDFAAS_CACHE": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_script_builds_the_version_the_tests_use() -> None:
    default = re.search(r"FEDFAAS_K8S_VERSION:-(v[0-9.]+)\}", SCRIPT.read_text())
    assert default is not None
    assert os.environ.get("FEDFAAS_K8S_VERSION", default.group(1)) == K8S_VERSION


@pytest.mark.parametrize("name", ["kube-scheduler", "coredns"])
def test_a_cached_binary_is_not_built_again(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "k8s" / "v1.34.1"
    folder.mkdir(parents=True)
    (folder / name).write_text("#!/bin/sh\n")
    (folder / name).chmod(0o755)
    res = _run(name, cache=tmp_path, FEDFAAS_K8S_VERSION="v1.34.1", PATH="/bin")
    assert res.returncode == 0, res.stderr  # no go on that PATH: nothing was built
    assert res.stdout.strip() == str(folder)


def test_bad_names_and_versions_are_refused(tmp_path: Path) -> None:
    res = _run("kube-apiserver;rm", cache=tmp_path)
    assert (
        res.returncode == 1 and "not a Kubernetes command name: 'kube-apiserver;rm'" in res.stderr
    )
    res = _run("kube-apiserver", cache=tmp_path, FEDFAAS_K8S_VERSION="1.34")
    assert (
        res.returncode == 1 and "FEDFAAS_K8S_VERSION=1.34 is not vMAJOR.MINOR.PATCH" in res.stderr
    )
    assert not (tmp_path / "k8s" / "1.34").exists()


CERT_MANAGER = {
    "crds": SCRIPT.with_name("cert-manager-crds.sh"),
    "controller": SCRIPT.with_name("cert-manager-controller.sh"),
}


@pytest.mark.parametrize("which", sorted(CERT_MANAGER))
def test_the_cert_manager_scripts_fetch_the_version_the_tests_use(which: str) -> None:
    default = re.search(
        r"FEDFAAS_CERT_MANAGER_VERSION:-(v[0-9.]+)\}", CERT_MANAGER[which].read_text()
    )
    assert default is not None and default.group(1) == "v1.19.2"
    assert os.environ.get("FEDFAAS_CERT_MANAGER_VERSION", default.group(1)) == CM_VERSION


def _run_cert_manager(which: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CERT_MANAGER[which])],
        env={**os.environ, "FEDFAAS_CACHE": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cached_cert_manager_controller_and_crds_are_not_fetched_again(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "cert-manager" / "v1.19.0"
    (folder / "controller-src").mkdir(parents=True)
    (folder / "crds").mkdir()
    (folder / "crds" / "cert-manager.io_certificates.yaml").write_text("kind: X\n")
    source = CERT_MANAGER["controller"].with_name("cert-manager-controller") / "main.go"
    (folder / "controller-src" / "main.go").write_bytes(source.read_bytes())
    binary = folder / "cert-manager-controller"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    for which, want in (("controller", binary), ("crds", folder / "crds")):
        # no go on that PATH (nor in /usr/local/go here): nothing was fetched nor built
        res = _run_cert_manager(
            which, tmp_path, FEDFAAS_CERT_MANAGER_VERSION="v1.19.0", PATH="/nonexistent:/bin"
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(want)


def test_a_cached_controller_of_another_main_go_is_built_again(tmp_path: Path) -> None:
    """The cache keeps the main.go a binary was built from: a changed main.go is a rebuild
    (here refused at once: GOSUMDB=off, which the script does not build with)."""
    folder = tmp_path / "cert-manager" / "v1.19.0"
    (folder / "controller-src").mkdir(parents=True)
    (folder / "controller-src" / "main.go").write_text("package main // an older one\n")
    (folder / "cert-manager-controller").write_text("#!/bin/sh\n")
    (folder / "cert-manager-controller").chmod(0o755)
    res = _run_cert_manager(
        "controller", tmp_path, FEDFAAS_CERT_MANAGER_VERSION="v1.19.0", GOSUMDB="off"
    )
    if "needs Go" in res.stderr:
        pytest.skip("no Go here: the script says so before anything else")
    assert res.returncode == 1 and "GOSUMDB=off" in res.stderr, res.stderr
    res = _run_cert_manager("crds", tmp_path / "empty", GOSUMDB="off")
    assert res.returncode == 1 and "GOSUMDB=off" in res.stderr, res.stderr


@pytest.mark.parametrize("which", sorted(CERT_MANAGER))
def test_the_cert_manager_scripts_refuse_a_bad_version(tmp_path: Path, which: str) -> None:
    res = _run_cert_manager(which, tmp_path, FEDFAAS_CERT_MANAGER_VERSION="1.19;rm")
    assert res.returncode == 1, res.stderr
    assert "FEDFAAS_CERT_MANAGER_VERSION=1.19;rm is not vMAJOR.MINOR.PATCH" in res.stderr
    assert not (tmp_path / "cert-manager").exists()

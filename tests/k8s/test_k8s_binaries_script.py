"""scripts/k8s-binaries.sh without building anything: the version it builds is the one the
tests look for, a cached binary is not built again, and bad input is refused, named."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

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

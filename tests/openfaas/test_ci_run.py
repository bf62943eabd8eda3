"""Where the conformance tests find the OpenFaaS binaries: `.ci/run` points them at
``../shared/openfaas/bin`` when that folder exists; a missing binary skips them, except under CI
(``FEDFAAS_OPENFAAS_BIN`` or ``CI`` set), where it fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("with_binaries", [True, False])
def test_ci_run_runs_every_tier_under_ci_with_the_openfaas_bin_folder_when_it_exists(
    tmp_path: Path, with_binaries: bool
) -> None:
    repo = tmp_path / "checkout"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    if with_binaries:
        (tmp_path / "shared" / "openfaas" / "bin").mkdir(parents=True)
    # a `make` that reports what `exec make test-all` would have seen
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "make").write_text(
        '#!/bin/sh\necho "$* ci=${CI:-unset} bin=${FEDFAAS_OPENFAAS_BIN:-unset}"\n'
    )
    (fake / "make").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("FEDFAAS_OPENFAAS_BIN", "CI")}
    env["PATH"] = f"{fake}:{env.get('PATH', '/usr/bin:/bin')}"
    out = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, env=env, check=True
    )
    if with_binaries:
        exported = out.stdout.strip().removeprefix("test-all ci=true bin=")
        assert Path(exported).resolve() == (tmp_path / "shared" / "openfaas" / "bin").resolve()
    else:
        assert out.stdout.strip() == "test-all ci=true bin=unset"


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({}, "1 skipped"),
        ({"CI": "true"}, "1 error"),
        ({"FEDFAAS_OPENFAAS_BIN": "/nonexistent/openfaas/bin"}, "1 error"),
    ],
    ids=["local", "CI", "bin-folder-set"],
)
def test_a_missing_binary_skips_locally_and_fails_under_ci(
    tmp_path: Path, env: dict[str, str], outcome: str
) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "FEDFAAS_OPENFAAS_BIN", "PATH")}
    # a PATH without faas-cli (the venv's python is called by its full path)
    base["PATH"] = str(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests/openfaas/test_shrinkwrap.py"),
        ],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=REPO,
        check=False,
    )
    assert outcome in out.stdout, out.stdout
    if outcome == "1 skipped":
        assert out.returncode == 0
        assert "the real OpenFaaS binary 'faas-cli' is not in PATH" in out.stdout
    else:
        assert out.returncode != 0 and "under CI" in out.stdout

"""``make docs-api``: the client SDK's API reference, built from its docstrings by Sphinx;
a docstring Sphinx warns about fails the build (and so this test)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from client.errors import CODES

REPO = Path(__file__).resolve().parents[2]
#: make's variables of a parent make (``make test`` runs pytest) stay out of the child
ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-o", "setup", *args],  # -o setup: the venv is there already
        cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip


@pytest.mark.slow  # over 5 s: `make test-slow`
def test_make_docs_api_documents_the_sdk_without_a_warning() -> None:
    out = _make("docs-api")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stderr and "ERROR" not in out.stderr, out.stderr
    site = REPO / "build" / "docs-api"
    job = (site / "job.html").read_text()
    for name in ("submit.submit_job", "submit.attach_job", "job.Job.enroll", "job.Job.wait",
                 "job.Job.model", "job.Job.history", "job.Job.query", "job.Job.report_failure"):  # fmt: skip
        assert f'id="client.{name}"' in job, name
    errors = (site / "errors.html").read_text()
    for cls in set(CODES.values()):
        assert f'id="client.errors.{cls.__name__}"' in errors, cls
    assert 'id="client.flower.run_numpy_client"' in (site / "flower.html").read_text()
    assert 'id="client.node.FLClient.upload"' in (site / "node.html").read_text()
    assert 'id="client.secure.SecureRound"' in (site / "secure.html").read_text()


def test_a_docstring_sphinx_warns_about_fails_the_targets_build(tmp_path: Path) -> None:
    """The target's own Sphinx command (from ``make -n``) on a module whose docstring is
    broken exits non-zero."""
    dry = _make("-n", "docs-api")
    assert dry.returncode == 0, dry.stderr
    [line] = [ln for ln in dry.stdout.splitlines() if " -m sphinx " in ln]
    cmd = shlex.split(line)
    src = tmp_path / "src"
    shutil.copytree(REPO / "docs" / "api", src, ignore=shutil.ignore_patterns("*.rst"))
    (src / "index.rst").write_text("Broken\n======\n\n.. automodule:: broken_doc\n")
    (tmp_path / "broken_doc.py").write_text(
        'def f() -> None:\n    """One line.\n\n      indented::\n  unindented\n    """\n'
    )
    cmd[cmd.index("docs/api")] = str(src)
    cmd[-1] = str(tmp_path / "site")
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0 and "broken_doc" in out.stderr, out.stderr

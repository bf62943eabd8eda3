"""The console's screenshots in ``docs/console``: each one is taken by the browser tests, the
operations page and the README link each one, and ``make docs-console`` runs those tests into that folder."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "docs" / "console"


def _taken() -> set[str]:
    """The file names the browser tests save their screenshots under."""
    source = (REPO / "tests" / "console" / "test_console_browser.py").read_text()
    return set(re.findall(r'shots / "(\w+\.png)"', source))


def test_every_screenshot_in_docs_is_taken_by_the_browser_tests_and_linked() -> None:
    taken = _taken()
    assert len(taken) >= 8, taken  # login, overview, jobs, job, flstore, checkpoints, ...
    assert {p.name for p in SHOTS.glob("*.png")} == taken
    linked = re.findall(r"\(console/(\w+\.png)\)", (REPO / "docs" / "operations.md").read_text())
    assert set(linked) == taken
    front = re.findall(r"\(docs/console/(\w+\.png)\)", (REPO / "README.md").read_text())
    assert set(front) == taken


def test_make_docs_console_runs_the_browser_tests_into_docs_console() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", "setup", "-o", "browser", "docs-console"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"FEDFAAS_CONSOLE_SHOTS={SHOTS}" in dry.stdout, dry.stdout
    assert "tests/console/test_console_browser.py" in dry.stdout, dry.stdout

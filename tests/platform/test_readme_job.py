"""The README's "Run your own job" snippet, run as written on a platform of its own.

The only edits are the ones a second platform on one machine needs: its state folder and the
ports it got (every other port may be taken by a platform the developer runs). Each edited text
must appear in the README exactly once, so the test fails when the snippet drifts from it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedfaas.platform import state
from tests.platform.conftest import ANY_PORTS_ENV

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`


def readme_job() -> tuple[list[str], str]:
    """The snippet's shell lines around the heredoc, and the Python inside it."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Run your own job", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no sh block under 'Run your own job'"
    body = block.group(1)
    py = re.search(r"<<'EOF'\n(.*?)\nEOF\n", body, re.S)
    assert py, "no python heredoc in the snippet"
    shell = [ln.split("#")[0].strip() for ln in body.splitlines() if ln.startswith(".venv/bin/")]
    return shell, py.group(1)


def _fedfaas(args: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_readme_job_runs_and_flstore_answers(tmp_path: Path) -> None:
    shell, code = readme_job()
    up, down = shell[0].split(), shell[-1].split()
    assert up[1:] == ["up", "--with", "all"] and down[1:] == ["down"]
    assert shell[1] == ".venv/bin/python - <<'EOF'"
    state_dir = tmp_path / "state"
    ports = ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane")
    env = {**os.environ, **ANY_PORTS_ENV, "FEDFAAS_PORTS": json.dumps(dict.fromkeys(ports, 0))}
    env.pop("OPENFAAS_URL", None)
    py = str(REPO / ".venv" / "bin" / "python")
    if not Path(py).exists():  # a checkout whose venv lives elsewhere
        py = sys.executable
    fedfaas = [py, "-m", "fedfaas.cli"]
    _fedfaas([*fedfaas, *up[1:], "--state-dir", str(state_dir)], env)
    try:
        st = state.load(state_dir)
        assert st is not None
        edits = {
            "http://127.0.0.1:8070": f"http://{st.host}:{st.ports['control_plane']}",
            "http://127.0.0.1:8092": f"http://{st.host}:{st.ports['request_tracker']}",
            '".state/secrets"': f'"{state_dir}/secrets"',
        }
        for old, new in edits.items():
            assert code.count(old) == 1, f"{old!r} appears {code.count(old)} times in the snippet"
            code = code.replace(old, new)
        out = subprocess.run(
            [py, "-"], input=code, capture_output=True, text=True, timeout=300, cwd=REPO, env=env
        )
        assert out.returncode == 0, out.stdout + out.stderr
        lines = dict(ln.split(": ", 1) for ln in out.stdout.splitlines() if ": " in ln)
        assert ast.literal_eval(lines["rounds"]) == [(1, "closed"), (2, "closed")]
        assert lines["final model version"] == "2"
        values = ast.literal_eval(lines["contributions"])
        assert len(values) == 6 and all(isinstance(v, float) for v in values.values())
        selected = ast.literal_eval(lines["next round"])
        assert len(selected) == 3 and set(selected) <= set(values)
    finally:
        _fedfaas([*fedfaas, *down[1:], "--state-dir", str(state_dir)], env)

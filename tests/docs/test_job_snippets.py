"""The snippets that need a running platform, run as written on one platform of their own:
the README's quick start, docs/jobs.md's SDK job, docs/flstore.md's HTTP query and every
example of its workloads, and docs/operations.md's one-machine block.

The only edits are the ones a second platform on one machine needs: its state folder and the
ports it got (every default port may be taken by a platform the developer runs). Each edited
text must appear in the snippet, so a test fails when the snippet drifts from what it edits.
The platform is started and stopped by the snippets' own first and last lines
(``tests/docs/test_docs.py`` holds them equal on every page).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from client.flstore import flstore_query
from fedfaas.platform import state
from flstore_workloads.registry import WORKLOADS
from tests.docs.snippets import REPO, command_lines, heredoc, snippet
from tests.platform.conftest import ANY_PORTS_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`

#: the job docs/jobs.md's snippet creates, which docs/flstore.md's examples ask about
JOB = "mine"


@dataclass(frozen=True)
class Platform:
    """The running platform: where it keeps its state, its addresses, how to run a command."""

    state_dir: Path
    env: dict[str, str]
    python: str
    urls: dict[str, str]

    def edit(self, text: str, *olds: str) -> str:
        """``text`` with each of ``olds`` (each must occur) pointed at this platform."""
        for old in olds:
            assert old in text, f"{old!r} is not in the snippet any more"
            text = text.replace(old, self.urls[old])
        return text.replace(".venv/bin/python", self.python).replace(
            ".venv/bin/fedfaas", f"{self.python} -m fedfaas.cli"
        )

    def run(self, argv: list[str], stdin: str | None = None) -> str:
        out = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=300, cwd=REPO, env=self.env
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def python_snippet(self, name: str, *olds: str) -> str:
        """Run the Python heredoc of snippet ``name``; its standard output."""
        return self.run([self.python, "-"], stdin=self.edit(heredoc(snippet(name).text), *olds))

    @property
    def ca(self) -> str:
        """The platform's CA (``fedfaas up`` serves TLS by default), as the snippets name it."""
        return str(self.state_dir / "secrets" / "tls" / "ca.crt")

    @property
    def verify(self) -> ssl.SSLContext:
        """httpx's ``verify`` trusting the platform's CA alone."""
        return ssl.create_default_context(cafile=self.ca)

    @property
    def analyst_token(self) -> str:
        return (self.state_dir / "secrets" / "analyst-token").read_text().strip()


def printed(stdout: str) -> dict[str, str]:
    """The ``name: value`` lines a snippet printed."""
    return dict(ln.split(": ", 1) for ln in stdout.splitlines() if ": " in ln)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    lines = command_lines(snippet("jobs-sdk-job").text)
    up, down = shlex.split(lines[0])[1:], shlex.split(lines[-1])[1:]
    state_dir = tmp_path_factory.mktemp("docs") / "state"
    ports = ("gateway", "gateway_node1", "cache_engine", "request_tracker", "control_plane")
    env = {**os.environ, **ANY_PORTS_ENV, "FEDFAAS_PORTS": json.dumps(dict.fromkeys(ports, 0))}
    env["FEDFAAS_STATE_DIR"] = str(state_dir)
    env.pop("OPENFAAS_URL", None)
    python = str(REPO / ".venv" / "bin" / "python")
    if not Path(python).exists():  # a checkout whose venv lives elsewhere
        python = sys.executable
    fedfaas = [python, "-m", "fedfaas.cli"]
    subprocess.run([*fedfaas, *up, "--state-dir", str(state_dir)], env=env, check=True, timeout=300)
    try:
        st = state.load(state_dir)
        assert st is not None and st.tls, "the snippets run fedfaas up's default: TLS"

        def at(part: str) -> str:
            return f"{st.host}:{st.ports[part]}"

        urls = {
            "https://127.0.0.1:8070": f"https://{at('control_plane')}",
            "https://127.0.0.1:8092": f"https://{at('request_tracker')}",
            "localhost:8080": at("runtime"),
            "localhost:8070": at("control_plane"),
            ".state/": f"{state_dir}/",
        }
        yield Platform(state_dir, env, python, urls)
    finally:
        subprocess.run([*fedfaas, *down, "--state-dir", str(state_dir)], env=env, timeout=300)


@pytest.fixture(scope="module")
def sdk_job(platform: Platform) -> dict[str, str]:
    """docs/jobs.md's job, run once: what it printed."""
    out = platform.python_snippet(
        "jobs-sdk-job", "https://127.0.0.1:8070", "https://127.0.0.1:8092", ".state/"
    )
    return printed(out)


def test_the_jobs_page_job_runs_and_flstore_answers(sdk_job: dict[str, str]) -> None:
    assert ast.literal_eval(sdk_job["rounds"]) == [(1, "closed"), (2, "closed")]
    assert sdk_job["final model version"] == "2"
    values = ast.literal_eval(sdk_job["contributions"])
    assert len(values) == 6 and all(isinstance(v, float) for v in values.values())
    selected = ast.literal_eval(sdk_job["next round"])
    assert len(selected) == 3 and set(selected) <= set(values)


def test_the_readme_quick_start_runs(platform: Platform) -> None:
    out = printed(
        platform.python_snippet("readme-quick-start", "https://127.0.0.1:8070", ".state/")
    )
    assert ast.literal_eval(out["rounds"]) == [(1, "closed"), (2, "closed")]


def test_the_flstore_http_query_answers(platform: Platform, sdk_job: dict[str, str]) -> None:
    (curl,) = command_lines(snippet("flstore-http-query").text)
    body = json.loads(shlex.split(curl)[-1])
    assert body["job"] == JOB
    answer = json.loads(
        platform.run(["bash", "-c", platform.edit(curl, "https://127.0.0.1:8092", ".state/")])
    )
    assert answer["result"]["workload"] == "multi-krum"
    assert len(answer["result"]["flagged"]) == body["params"]["f"]
    assert {"latency_s", "hit", "function"} <= set(answer)


def test_flstore_names_what_is_wrong_with_a_query(
    platform: Platform, sdk_job: dict[str, str]
) -> None:
    """docs/flstore.md: bad parameters get 422 naming each field, an unknown workload 404 with
    the known ones."""
    url = platform.urls["https://127.0.0.1:8092"] + "/v1/queries?wait=true"
    auth = {"Authorization": f"Bearer {platform.analyst_token}"}
    bad = {"workload": "multi-krum", "job": JOB, "rounds": [2], "params": {"f": "many"}}
    resp = httpx.post(url, json=bad, headers=auth, timeout=120, verify=platform.verify)
    assert resp.status_code == 422 and resp.json()["error"] == "invalid_params", resp.text
    assert "f" in resp.text
    unknown = {"workload": "no-such-workload", "job": JOB, "rounds": [2]}
    resp = httpx.post(url, json=unknown, headers=auth, timeout=120, verify=platform.verify)
    assert resp.status_code == 404 and resp.json()["error"] == "unknown_workload", resp.text
    assert "multi-krum" in resp.text


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_each_flstore_example_answers_with_the_keys_shown(
    platform: Platform, sdk_job: dict[str, str], workload: str
) -> None:
    example = json.loads(snippet(f"flstore-{workload}").text)
    query = example["query"]
    assert query["workload"] == workload
    answer = flstore_query(
        platform.urls["https://127.0.0.1:8092"],
        workload,
        JOB,
        rounds=query.get("rounds"),
        params=query.get("params"),
        token=platform.analyst_token,
        ca_file=platform.ca,
    )
    got = answer["result"]
    assert set(example["result"]) == set(got), json.dumps(got)


def test_the_operations_block_runs(platform: Platform) -> None:
    lines = command_lines(snippet("operations-one-machine").text)[1:-1]  # up and down: above
    status, deploy, echo, metrics, logs = lines
    assert "runtime" in platform.run(["bash", "-c", platform.edit(status)])
    platform.run(["bash", "-c", platform.edit(deploy)])
    assert platform.run(["bash", "-c", platform.edit(echo, "localhost:8080", ".state/")]) == "hello"
    count = platform.run(["bash", "-c", platform.edit(metrics, "localhost:8070", ".state/")])
    assert int(count) > 0
    listed = platform.run(["bash", "-c", platform.edit(logs, ".state/")]).split()
    assert {"runtime.log", "control-plane.log"} <= set(listed)

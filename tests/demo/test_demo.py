"""``make demo`` end to end: the platform ``fedfaas up --with all`` starts, a job created on the
control plane, real PyTorch clients (one sign-flipping), aggregation only in replicas of the
``aggregator`` function, and FLStore's three answers asked over HTTP; then nothing is left.

The small job runs in the default test run (about 30 s); the demo exactly as ``make demo``
runs it (20 clients, 5 rounds, the CLI) is marked slow, and so is ``make demo`` holding the
platform (``FEDFAAS_DEMO_HOLD``) while a person logs in to the console it printed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from fedfaas.demo import DemoConfig, run
from tests.commands import run_module
from tests.platform.conftest import ANY_PORTS, ANY_PORTS_ENV

OPTIONAL_PORTS = (
    "gateway",
    "gateway_node1",
    "cache_engine",
    "request_tracker",
    "control_plane",
    "console",
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`


def assert_nothing_left(report: dict[str, Any], state: Path) -> None:
    """No process, shared-memory folder or router socket folder of the demo's platform."""
    pid = report["platform_id"]
    assert pid, "the demo recorded its platform id"
    assert not Path(f"/dev/shm/fedfaas-{pid[:12]}").exists()
    assert not Path(f"/tmp/fedfaas-{pid[:12]}").exists()
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.environ() if str(state) not in cmd else {}
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if str(state) in cmd or env.get("FEDFAAS_PLATFORM_ID") == pid:
            left.append(cmd)
    assert left == []
    # only the platform's logs stay behind (as after `fedfaas down`), beside the report
    assert sorted(x.name for x in (state / "demo" / "platform").iterdir()) == ["logs"]


def assert_answers(report: dict[str, Any], clients: list[str], planted: str, k: int) -> None:
    a = report["answers"]
    assert a["malicious"]["flagged"] == [planted] and a["malicious"]["found"]
    assert a["malicious"]["cosine_flagged"] == [planted]
    values = a["shapley"]["values"]
    assert sorted(values) == clients, "a Shapley value for every client"
    assert min(values, key=values.__getitem__) == planted == a["shapley"]["lowest"]
    assert values[planted] < 0
    picked = a["oort"]["selected"]
    assert len(picked) == len(set(picked)) == k
    assert set(picked) <= set(clients) - {planted}, "Oort picks among the unflagged clients"


def assert_aggregated_by_the_function(report: dict[str, Any], rounds: int) -> None:
    agg = report["aggregation"]
    assert agg["function"] == "aggregator" and agg["endpoints_all_replicas"]
    assert agg["replicas"] and sum(r["tasks"] for r in agg["replicas"]) == agg["tasks"]
    # every round: at least one leaf per node and the top
    assert agg["tasks"] >= 3 * rounds, agg


def test_the_demo_on_a_small_job_finds_the_sign_flipper_values_and_schedules_clients(
    tmp_path: Path,
) -> None:
    cfg = DemoConfig(
        clients=6,
        rounds=3,
        malicious="client-003",
        select=3,
        min_accuracy=0.3,
        platform={**ANY_PORTS, "ports": dict.fromkeys(OPTIONAL_PORTS, 0)},
    )
    code = run(tmp_path, cfg)
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert code == 0, report["problems"]
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert all(r["fedavg_max_rel_err"] < 1e-5 for r in report["rounds"])
    assert all(r["accepted"] == 6 for r in report["rounds"])
    assert sum(report["placement"].values()) == 6 and len(report["placement"]) == 2
    # the platform `fedfaas up --with all` starts by default: every part over https
    assert all(report["urls"][p].startswith("https://") for p in OPTIONAL_PORTS)
    assert all(url.startswith("https://") for url in report["placement"])
    assert [k.split("/rounds/")[1] for k in report["checkpoint_keys"]] == [
        f"{r:06d}/global.safetensors" for r in range(4)
    ]
    assert_answers(report, [f"client-{i:03d}" for i in range(6)], "client-003", 3)
    assert_aggregated_by_the_function(report, 3)
    assert (tmp_path / "demo" / "demo.png").stat().st_size > 10_000
    assert_nothing_left(report, tmp_path)


def test_a_demo_that_fails_still_stops_the_platform(tmp_path: Path) -> None:
    cfg = DemoConfig(
        clients=4,
        rounds=1,
        malicious="client-042",  # not a client: the demo fails after the platform is up
        platform={**ANY_PORTS, "ports": dict.fromkeys(OPTIONAL_PORTS, 0)},
    )
    assert run(tmp_path, cfg) == 1
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert "client-042" in report["error"]
    assert_nothing_left(report, tmp_path)


def _demo_env(**demo_env: str) -> dict[str, str]:
    """This environment on free ports, with only the ``FEDFAAS_DEMO_*`` of ``demo_env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_DEMO_")}
    env |= {**ANY_PORTS_ENV, "FEDFAAS_PORTS": json.dumps(dict.fromkeys(OPTIONAL_PORTS, 0))}
    return {**env, **demo_env}


def _demo_cli(*args: str, **demo_env: str) -> subprocess.CompletedProcess[str]:
    """``fedfaas demo ARGS`` on free ports, with only the ``FEDFAAS_DEMO_*`` of ``demo_env``;
    asserts that it exits 0."""
    out = run_module("fedfaas.cli", "demo", *args, timeout=600, env=_demo_env(**demo_env))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_make_demo_runs_the_default_job_and_answers_the_three_questions(tmp_path: Path) -> None:
    out = _demo_cli("--state-dir", str(tmp_path))
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4, 5]
    assert report["rounds"][-1]["accuracy"] >= 0.8
    assert all(r["fedavg_max_rel_err"] < 1e-5 for r in report["rounds"])
    assert_answers(report, [f"client-{i:03d}" for i in range(20)], "client-007", 10)
    assert_aggregated_by_the_function(report, 5)
    for line in ("which client is malicious?", "GTG-Shapley", "Oort picks 10"):
        assert line in out.stdout
    assert f"operations console: {report['urls']['console']}" in out.stdout  # issue 40
    assert_nothing_left(report, tmp_path)


def test_fedfaas_demo_mode_async_runs_fedbuff_with_slow_clients_through_the_cli(
    tmp_path: Path,
) -> None:
    out = _demo_cli(
        *("--mode", "async", "--state-dir", str(tmp_path)),
        FEDFAAS_DEMO_CLIENTS="8",  # buffers of 4 updates (the least); 2 rounds' worth: 4
        FEDFAAS_DEMO_ROUNDS="2",
        FEDFAAS_DEMO_SELECT="3",
    )
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert report["config"]["mode"] == "async"
    assert "async (FedBuff): 4 versions of 4 updates, 2 clients 5x slower" in out.stdout
    versions = [r["version"] for r in report["rounds"]]
    assert versions == sorted(versions) and versions[-1] == 4
    assert report["rounds"][-1]["accuracy"] >= 0.5
    # every version is checkpointed in MinIO
    assert [k.split("/rounds/")[1] for k in report["checkpoint_keys"]] == [
        f"{r:06d}/global.safetensors" for r in range(5)
    ]
    assert_aggregated_by_the_function(report, 4)
    assert_nothing_left(report, tmp_path)


REPO = Path(__file__).resolve().parents[2]
#: seconds ``make demo`` holds the platform in the test: the console checks take a few
HOLD_S = 60
#: the line the demo prints for a person: the console's address and the admin token's file
CONSOLE_LINE = re.compile(
    r"operations console: (?P<url>https://\S+)  log in with the token in (?P<admin>\S+) \(admin\) "
    r"or analyst-token beside it \(up for (?P<hold>\d+) s more\)"
)


class Output:
    """The lines a process prints, read as they come (a thread pumps them into a queue)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.said: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def tail(self) -> str:
        return "".join(self.said)[-3000:]

    def until(self, marker: str | None, timeout: float = 600) -> str:
        """Everything said so far once a line holds ``marker`` (``None``: the end); fails if
        the process ends first or says nothing for ``timeout`` seconds."""
        while marker is None or not any(marker in line for line in self.said):
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"nothing said for {timeout:.0f} s; so far: {self.tail()}")
            if line is None:
                if marker is None:
                    break
                pytest.fail(f"the process ended before saying {marker!r}: {self.tail()}")
            self.said.append(line)
        return "".join(self.said)


def _signals_as_in_a_terminal() -> None:
    """Ctrl-C and Ctrl-\\ at their defaults in ``make demo``, as in a terminal: a process
    started in the background by a shell without job control (``cmd &`` in a script, as a CI
    runner may start the suite) inherits SIGINT and SIGQUIT ignored, and so would every
    process of the demo, which then never sees the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.mark.timeout(900)  # the demo, the hold, the stop
@pytest.mark.parametrize("ends", ["when_the_hold_ends", "on_ctrl_c"])
def test_make_demo_holds_the_platform_so_a_person_can_log_in_to_the_console(
    tmp_path: Path, ends: str
) -> None:
    ctrl_c = ends == "on_ctrl_c"
    hold = 3600 if ctrl_c else HOLD_S  # Ctrl-C: the person stops it long before
    env = _demo_env(
        FEDFAAS_DEMO_CLIENTS="6",
        FEDFAAS_DEMO_ROUNDS="2",
        FEDFAAS_DEMO_MALICIOUS="",  # all honest: two rounds reach the demo's accuracy
        FEDFAAS_DEMO_SELECT="3",
        FEDFAAS_DEMO_HOLD=str(hold),
    )
    for var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # not a sub-make of `make test-slow`
        env.pop(var, None)
    # `make demo` as a person runs it, in a process group of its own as in a terminal (where
    # Ctrl-C signals the whole group); its set-up prerequisite is taken as done (-o setup)
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "-o", "setup", "demo", f"STATE={tmp_path}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_signals_as_in_a_terminal,
    )
    out = Output(proc)
    try:
        said = out.until("holding the platform for")
        printed = CONSOLE_LINE.search(said)
        assert printed is not None, out.tail()
        assert int(printed["hold"]) == hold
        console = printed["url"]
        secrets = Path(printed["admin"]).parent
        analyst = (secrets / "analyst-token").read_text().strip()
        # the platform serves TLS (fedfaas up's default): the browser trusts its CA
        ca = str(secrets / "tls" / "ca.crt")
        assert f"import the platform's CA, {ca}, in the browser" in said, out.tail()
        trust = ssl.create_default_context(cafile=ca)
        with httpx.Client(base_url=console, timeout=30, verify=trust) as c:
            # what a person does: the page sends them to the login, the analyst token lets in
            assert c.get("/jobs").headers["location"] == "/login"
            assert c.post("/login", data={"token": "not-the-token"}).status_code == 401
            logged_in = c.post("/login", data={"token": analyst})
            assert logged_in.status_code == 303, logged_in.text
            page = c.get("/jobs/digits")
            assert page.status_code == 200 and "Job digits" in page.text
            jobs = c.get("/api/jobs").json()["jobs"]
            assert [(j["job"], j["completed"], j["done"]) for j in jobs] == [("digits", 2, True)]
            timeline = c.get("/api/jobs/digits").json()["timeline"]
            assert [(r["round"], r["state"]) for r in timeline[:2]] == [
                (1, "closed"),
                (2, "closed"),
            ]
        if ctrl_c:
            os.killpg(proc.pid, signal.SIGINT)  # the demo said: "Ctrl-C to stop now"
        said = out.until(None, timeout=HOLD_S + 600)  # the hold ends, the platform stops
        # make waits for the demo, then ends as Ctrl-C ended it
        assert proc.wait(timeout=60) == (-signal.SIGINT if ctrl_c else 0), out.tail()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the demo takes its platform down on SIGTERM
            proc.wait(timeout=300)
    assert "platform stopped in" in said.rsplit("holding the platform for", 1)[1], out.tail()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{console}/healthz", timeout=10)
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert report["urls"]["console"] == console
    assert report["problems"] == [] and report["error"] == ""
    assert_nothing_left(report, tmp_path)

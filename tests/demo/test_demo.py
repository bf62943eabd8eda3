"""``make demo`` end to end: the platform ``fedfaas up --with all`` starts, a job created on the
control plane, real PyTorch clients (one sign-flipping), aggregation only in replicas of the
``aggregator`` function, and FLStore's three answers asked over HTTP; then nothing is left.

The small job runs in the default test run (about 30 s); the demo exactly as ``make demo``
runs it (20 clients, 5 rounds, the CLI) is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

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


def _demo_cli(*args: str, **demo_env: str) -> subprocess.CompletedProcess[str]:
    """``fedfaas demo ARGS`` on free ports, with only the ``FEDFAAS_DEMO_*`` of ``demo_env``;
    asserts that it exits 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_DEMO_")}
    env |= {**ANY_PORTS_ENV, "FEDFAAS_PORTS": json.dumps(dict.fromkeys(OPTIONAL_PORTS, 0))}
    out = run_module("fedfaas.cli", "demo", *args, timeout=600, env={**env, **demo_env})
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

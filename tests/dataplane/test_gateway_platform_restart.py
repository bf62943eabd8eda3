"""A rolling restart of a node gateway on ``fedfaas up`` loses nothing; ``fedfaas down`` leaves no
store behind (issue 35).

``fedfaas up --with gateway``: MinIO, Redis, the runtime, two node gateways, the supervisor. A
job on node0's gateway; half its round's updates are acknowledged, then the gateway gets
SIGTERM (what a rolling update of the DaemonSet's pod sends) and stops cleanly. The supervisor
starts it again on its port, with its journal and its store: the round resumes, an
acknowledged client's second send hears 409 ``duplicate_client``, and once the others have
sent theirs the model is the exact FedAvg of all of them, each once. ``fedfaas down`` is the
uninstall: no store folder of the platform is left in the shared memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from core import wire
from fedfaas.platform import credentials, state
from tests.commands import run_module
from tests.dataplane.gwutil import tiny_model
from tests.dataplane.rounds import assert_fedavg, expected, post_update, upload, wait_version
from tests.platform.running import any_ports_env, running_platform
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENTS = ["c0", "c1", "c2", "c3"]
SEEDS, WEIGHTS = [71, 72, 73, 74], [3, 1, 4, 2]


def _fedfaas(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_module("fedfaas.cli", *args, timeout=600, env=env)


@pytest.fixture()
def platform(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """``fedfaas up --with gateway`` on free ports: ``(state folder, environment)``; the test
    takes it down itself (``down`` runs again on the way out: nothing left to stop then, unless
    the test failed before)."""
    state_dir = tmp_path / "state"
    env = any_ports_env(FEDFAAS_PORTS=json.dumps(dict.fromkeys(("gateway", "gateway_node1"), 0)))
    with running_platform(state_dir, "--with", "gateway", env=env, timeout=600):
        yield state_dir, env


def _endpoints(url: str, admin: dict[str, str]) -> int:
    got = httpx.get(f"{url}/v1/router", headers=admin, timeout=10).json()["endpoints"]
    return sum(1 for e in got if not e["local"])


def test_a_node_gateway_stopped_mid_round_by_sigterm_resumes_it_and_down_leaves_no_store(
    platform: tuple[Path, dict[str, str]],
) -> None:
    state_dir, env = platform
    st = state.load(state_dir)
    assert st is not None
    url = f"http://{st.host}:{st.ports['gateway']}"
    secrets = state_dir / "secrets"
    admin = {"Authorization": "Bearer " + (secrets / "gateway-admin-secret").read_text().strip()}
    # one replica of the aggregator function per node: node0's gets the job's slots
    r = httpx.post(
        f"http://{st.host}:{st.ports['runtime']}/system/scale-function/aggregator",
        json={"serviceName": "aggregator", "replicas": 2},
        auth=credentials.basic_auth(secrets),
        timeout=10,
    )
    assert r.status_code < 300, r.text
    wait_until(lambda: _endpoints(url, admin) >= 2, 120, "an aggregator replica on node0")
    r = httpx.post(
        url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 4, "clients": ",".join(CLIENTS)},
        content=wire.encode_tensors(tiny_model(0)),
        headers=admin,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    for i in (0, 1, 2):  # acknowledged: one leaf finishes, the other holds one update
        upload(url, tokens, CLIENTS[i], 1, SEEDS[i], WEIGHTS[i])
    store = Path(st.shm_dir) / f"fedfaas-{st.platform_id[:12]}"
    rec = st.record("gateway")
    assert rec is not None
    os.kill(rec.pid, signal.SIGTERM)
    psutil.Process(rec.pid).wait(60)
    log = (state_dir / "logs" / "gateway.log").read_text()
    assert "abandoning" not in log, log[-3000:]  # a clean stop (not its grace's forced exit)...
    assert any((store / "node0" / "j1").iterdir())  # ... that kept the job's store

    def restarted() -> bool:
        now = state.load(state_dir)
        assert now is not None
        again = now.record("gateway")
        if again is None or again.pid == rec.pid or again.extra.get("restarts") != "1":
            return False
        try:
            return httpx.get(url + "/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(restarted, 120, "the supervisor to start node0's gateway again")
    again = post_update(url, "j1", 1, tokens["c1"], "c1", wire.encode_tensors(tiny_model(99)), 1)
    assert again.status_code == 409 and again.json()["error"] == "duplicate_client"
    upload(url, tokens, "c3", 1, SEEDS[3], WEIGHTS[3])
    got = wait_version(url, tokens["c0"], 1, timeout=120)
    assert_fedavg(got, expected(SEEDS, WEIGHTS))
    r = httpx.get(url + "/v1/jobs/j1", headers=admin, timeout=10)
    assert r.status_code == 200 and r.json()["dropped"]["updates"] == 0, r.text

    down = _fedfaas("down", "--state-dir", str(state_dir), env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not store.exists()
    assert not list(Path(st.shm_dir).glob(f"fedfaas-{st.platform_id[:12]}*"))

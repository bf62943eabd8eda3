"""A gateway process stopped mid-round and restarted on the same state, store and Redis resumes
the round from its journal: every update answered 202 counts exactly once. Killed (SIGKILL), or
stopped cleanly (SIGTERM, as a rolling restart of the node gateway's pod does): a clean stop
leaves the store for the restart as a crash does (issue 35: it used to empty it, and the open
round's acknowledged updates were dropped from the journal as lost)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from core import wire
from core.services import free_port, wait_for_port
from gateway.settings import GatewaySettings
from tests.aggregators import NodeAggregators
from tests.dataplane.gwutil import tiny_model
from tests.dataplane.rounds import assert_fedavg, expected, post_update, upload, wait_version
from tests.polling import wait_until

pytestmark = pytest.mark.integration


def _gateway(tmp: Path, redis_url: str, port: int, shm: Path) -> subprocess.Popen[bytes]:
    settings = GatewaySettings(
        node="n1",
        port=port,
        state_dir=tmp / "state",
        redis_url=redis_url,
        redis_credentials_file=redis_url.credentials_file("gateway"),  # type: ignore[attr-defined]
        shm_root=shm,
        prefer_ebpf=False,
        fanout=2,
        pool=3,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFAAS_GATEWAY_")}
    with open(tmp / "gateway.log", "ab") as log:  # both lives of the gateway, one after the other
        p = subprocess.Popen(
            settings.to_argv(log_level="WARNING"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    wait_for_port("127.0.0.1", port, 60, p)
    return p


def _aggregators(tmp: Path, url: str) -> NodeAggregators:
    """Replicas of the aggregator function for :func:`_gateway`'s node (spawn them); they
    register again by themselves once a restarted gateway is back."""
    sock = GatewaySettings(node="n1", state_dir=tmp / "state").socket_path()
    return NodeAggregators(
        "n1", sock, tmp / "aggregators", url, admin_secret_file=tmp / "state" / "admin-secret"
    )


def _kill(p: subprocess.Popen[bytes], sig: int) -> int | None:
    """Signal the gateway's process group and wait for it; its exit status."""
    if p.poll() is None:
        os.killpg(p.pid, sig)
        p.wait(30)
    return p.returncode


PUSHED = {  # a plan unlike the static one (leaves of 3 and 1 instead of 2 and 2)
    "slots": [
        {"id": 1, "node": "n1", "role": 3, "goal": 4, "parent": None},
        {"id": 5, "node": "n1", "role": 1, "goal": 3, "parent": 1},
        {"id": 6, "node": "n1", "role": 1, "goal": 1, "parent": 1},
    ],
    "version": 7,
}


@pytest.mark.parametrize(
    ("pushed", "sig"),
    [(False, signal.SIGKILL), (True, signal.SIGKILL), (False, signal.SIGTERM)],
    ids=["static-plan-sigkill", "pushed-plan-sigkill", "static-plan-sigterm"],
)
def test_stopped_gateway_resumes_the_round_from_its_journal(
    tmp_path: Path, redis_url: str, pushed: bool, sig: signal.Signals
) -> None:
    shm = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    port = free_port()
    gw = _gateway(tmp_path, redis_url, port, shm)
    url = f"http://127.0.0.1:{port}"
    secret = (tmp_path / "state" / "admin-secret").read_text().strip()
    clients = ["c0", "c1", "c2", "c3"]
    r = httpx.post(
        url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 4, "clients": ",".join(clients)},
        content=wire.encode_tensors(tiny_model(0)),
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert r.status_code == 201, r.text
    info = r.json()
    # two replicas of the aggregator function (one endpoint each), as the runtime starts them;
    # they register again by themselves once the gateway is back
    aggs = _aggregators(tmp_path, url)
    aggs.spawn(2)
    seeds, weights = [31, 32, 33, 34], [2, 3, 5, 7]
    try:
        aggs.wait_registered(2)
        deadline = time.monotonic() + 60
        while httpx.get(url + "/healthz").json()["router"] and time.monotonic() < deadline:
            st = httpx.get(
                url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {secret}"}
            ).json()
            if st["progress"] is not None:
                break
        if pushed:
            r = httpx.put(
                url + "/v1/jobs/j1/rounds/1/plan",
                json=PUSHED,
                headers={"Authorization": f"Bearer {secret}"},
            )
            assert r.status_code == 200 and r.json()["applied"], r.text
        for i in range(3):  # leaf 1 completes (its partial is journaled), leaf 2 holds one update
            upload(url, info["tokens"], clients[i], 1, seeds[i], weights[i])
        # the top folded the finished leaf's partial and checkpointed: the partial is freed,
        # so the restart must resume the top from its checkpoint
        r_client = redis_url.server.client()  # type: ignore[attr-defined]

        def top_checkpoint() -> list[int] | None:
            raw = r_client.hget("fedfaas:job:j1:round:1:checkpoints", "n1/1")
            return None if raw is None else list(json.loads(raw)["children"])

        try:
            children = wait_until(top_checkpoint, 60, "the top's checkpoint of the finished leaf")
        finally:
            r_client.close()
        assert children == [5 if pushed else 2]
        rc = _kill(gw, sig)
        if sig == signal.SIGTERM:
            assert rc == 0, (tmp_path / "gateway.log").read_text()[-3000:]  # a clean stop
            assert any((shm / "n1" / "j1").iterdir())  # ... that kept the job's store
        gw = _gateway(tmp_path, redis_url, port, shm)  # same state, store and Redis
        st = httpx.get(url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {secret}"}).json()
        assert st["pushed_plan"] is pushed and st["plan_version"] == (7 if pushed else None)
        r = post_update(
            url, "j1", 1, info["tokens"]["c1"], "c1", wire.encode_tensors(tiny_model(99)), 1
        )
        assert r.status_code == 409 and r.json()["error"] == "duplicate_client"  # c1 still counted
        upload(url, info["tokens"], clients[3], 1, seeds[3], weights[3])
        got = wait_version(url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(seeds, weights))
    finally:
        _kill(gw, signal.SIGTERM)
        aggs.stop()
        shutil.rmtree(shm, ignore_errors=True)  # a stop keeps it: the test made it, removes it

"""The coordinator driving real node gateways (``python -m gateway``) end to end.

Two gateways share a Redis journal and an admin secret, each with a spawned aggregator
process (userspace router, no eBPF needed). Only their public HTTP API is used.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

from control_plane.api import create_app
from control_plane.calibrate import measure_gateway
from control_plane.coordinator import Coordinator
from control_plane.settings import ControlPlaneSettings
from fedfaas.services import free_port, wait_for_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def real_gateways(redis_url, tmp_path):
    secret = secrets.token_hex(32)
    (tmp_path / "secret").write_text(secret)
    (tmp_path / "secret").chmod(0o600)
    ports = {"n1": free_port(), "n2": free_port()}
    procs = []
    try:
        for node, port in ports.items():
            peer = next(f"{n}=http://127.0.0.1:{p}" for n, p in ports.items() if n != node)
            log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gateway",
                        "--node",
                        node,
                        "--port",
                        str(port),
                        "--state-dir",
                        str(tmp_path / node),
                        "--redis",
                        redis_url,
                        "--shm-root",
                        str(tmp_path / "shm"),
                        "--no-ebpf",
                        "--peer",
                        peer,
                        "--spawn-aggregators",
                        "2",
                    ],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={
                        **__import__("os").environ,
                        "FEDFAAS_GATEWAY_ADMIN_SECRET_FILE": str(tmp_path / "secret"),
                    },
                )
            )
            log.close()
        for p, port in zip(procs, ports.values(), strict=True):
            wait_for_port("127.0.0.1", port, 60, p)
        yield {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}, secret
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def token(secret: str, job: str, client: str) -> str:
    return hmac.new(secret.encode(), f"{job}/{client}".encode(), hashlib.sha256).hexdigest()


def upload(url, job, rnd, client, secret, tensors, weight):
    return httpx.post(
        f"{url}/v1/jobs/{job}/rounds/{rnd}/updates",
        content=save(tensors),
        headers={
            "X-Client-Id": client,
            "X-Sample-Count": str(weight),
            "Authorization": f"Bearer {token(secret, job, client)}",
        },
        timeout=30,
    )


def test_round_runs_through_real_gateways_and_the_model_is_flat_fedavg(real_gateways):
    urls, secret = real_gateways
    coord = Coordinator(urls, mc=3.0, admin_token=secret)
    w0 = {"a": np.zeros(64, np.float32), "b": np.zeros((3, 4), np.float32)}
    rng = np.random.default_rng(0)
    with TestClient(create_app(ControlPlaneSettings(tick_s=0.05), coord)) as api:
        r = api.post(
            "/v1/jobs",
            json={
                "job": "real",
                "rounds": 2,
                "goal": 4,
                "clients": 8,
                "weights_b64": base64.b64encode(save(w0)).decode(),
            },
        )
        assert r.status_code == 201, r.text
        rnd = r.json()["round"]
        assert rnd["number"] == 1 and rnd["selected"] == 6
        sent, late = [], None
        for c in (f"c{i}" for i in range(8)):
            a = api.get("/v1/jobs/real/assignment", params={"client": c})
            if a.status_code != 200:
                continue
            if len(sent) == 4:
                late = (c, a.json())
                break
            t = {
                "a": rng.integers(-8, 8, 64).astype(np.float32),
                "b": rng.integers(-8, 8, (3, 4)).astype(np.float32),
            }
            wgt = int(rng.integers(1, 9))
            res = upload(a.json()["gateway_url"], "real", 1, c, secret, t, wgt)
            if res.status_code == 409 and res.json()["error"] == "round_full":
                continue  # that node's share of the goal is full: an over-provisioned spare
            assert res.status_code == 202, res.text
            sent.append((t, wgt))
        assert len(sent) == 4
        deadline = time.monotonic() + 60
        while api.get("/v1/jobs/real").json()["completed"] < 1:
            assert time.monotonic() < deadline, api.get("/v1/jobs/real").json()
            time.sleep(0.05)
        job = api.get("/v1/jobs/real").json()
        assert job["history"][0]["state"] == "closed" and job["history"][0]["published"]
        assert job["round"]["number"] == 2 and job["round"]["state"] == "open"
        m = httpx.get(
            f"{urls['n1']}/v1/jobs/real/model", headers={"Authorization": f"Bearer {secret}"}
        )
        assert m.status_code == 200 and m.headers["x-model-version"] == "1"
        model = load(m.content)
        total = sum(w for _, w in sent)
        for name in ("a", "b"):
            want = sum(w * t[name].astype(np.float64) for t, w in sent) / total
            np.testing.assert_allclose(model[name], want, rtol=1e-6, atol=1e-6)
        if late is not None:  # a round-1 update after the round closed is refused by its gateway
            c, a = late
            url = a["gateway_url"]
            while httpx.get(f"{url}/v1/jobs/real").json()["round"] < 2:  # node catches up
                assert time.monotonic() < deadline
                time.sleep(0.02)
            res = upload(url, "real", 1, c, secret, w0, 1)
            assert res.status_code == 409 and res.json()["error"] == "stale_round"


def test_calibrate_measures_a_positive_capacity_on_a_real_gateway(real_gateways):
    urls, secret = real_gateways
    w0 = {"w": np.zeros(4096, np.float32)}
    upd = {"w": np.ones(4096, np.float32)}
    cal = asyncio.run(
        measure_gateway(urls["n1"], save(w0), save(upd), secret, (1, 2, 4), 1.5, 1, "cal", 60.0)
    )
    assert list(cal.levels)[:2] == [1, 2]
    assert all(e > 0 for e in cal.exec_times) and all(k > 0 for k in cal.rates)
    assert cal.mc > 0

"""The coordinator driving real node gateways (``python -m gateway``) end to end.

Two gateways share a Redis journal and an admin secret, each with replicas of the
``aggregator`` function registered with its router (userspace router, no eBPF needed; see
``realgw``). Only their public HTTP API is used.
"""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import numpy as np
import pytest
from safetensors.numpy import load, save

from control_plane.calibrate import measure_gateway
from control_plane.coordinator import Coordinator
from fedfaas.auth import bearer
from tests.control import realgw
from tests.tokens import control_client

pytestmark = pytest.mark.integration


@pytest.fixture()
def real_gateways(redis_url, tmp_path):
    with realgw.real_gateways(redis_url, tmp_path) as (urls, secret, _procs):
        yield urls, secret


def upload(url, job, rnd, client, token, tensors, weight):
    return realgw.upload(url, job, rnd, client, token, tensors, weight)


def test_round_runs_through_real_gateways_and_the_model_is_flat_fedavg(real_gateways):
    urls, secret = real_gateways
    coord = Coordinator(urls, mc=3.0, admin_token=secret)
    w0 = {"a": np.zeros(64, np.float32), "b": np.zeros((3, 4), np.float32)}
    rng = np.random.default_rng(0)
    with control_client(coord, secret, tick_s=0.05) as api:
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
        tokens = r.json()["tokens"]
        rnd = r.json()["round"]
        assert rnd["number"] == 1 and rnd["selected"] == 6
        # the gateways run the coordinator's plan, not their static one
        assert rnd["placement"] == "coordinator"
        for url in urls.values():
            st = httpx.get(f"{url}/v1/jobs/real", headers=bearer(secret)).json()
            assert st["pushed_plan"] and st["plan_version"] == rnd["plan_version"]
            assert {"queue", "k", "E_s", "pending"} <= st.keys()
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
            res = upload(a.json()["gateway_url"], "real", 1, c, tokens[c], t, wgt)
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
        # 6 selected, goal 4: the gateways were told to aggregate the 4 that arrived
        assert job["history"][0]["received"] == 4 and job["history"][0]["closing"] == "goal"
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
            while httpx.get(f"{url}/v1/jobs/real", headers=bearer(secret)).json()["round"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            res = upload(url, "real", 1, c, tokens[c], w0, 1)
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


def test_a_round_past_its_deadline_aggregates_what_arrived_on_real_gateways(real_gateways):
    urls, secret = real_gateways
    coord = Coordinator(urls, mc=2.0, admin_token=secret)
    w0 = {"a": np.zeros(32, np.float32)}
    rng = np.random.default_rng(5)
    with control_client(coord, secret, tick_s=0.05) as api:
        r = api.post(
            "/v1/jobs",
            json={
                "job": "late",
                "rounds": 1,
                "goal": 4,
                "clients": 4,
                "deadline_s": 3.0,
                "weights_b64": base64.b64encode(save(w0)).decode(),
            },
        )
        assert r.status_code == 201, r.text
        tokens = r.json()["tokens"]
        assert r.json()["round"]["clients_per_node"] == {"n1": 2, "n2": 2}
        sent, seen = [], set()
        for c in ("c0", "c1", "c2", "c3"):
            a = api.get("/v1/jobs/late/assignment", params={"client": c}).json()
            if a["node"] in seen:
                continue  # one update per node: the goal of 4 is never reached
            seen.add(a["node"])
            t = {"a": rng.standard_normal(32).astype(np.float32)}
            w = int(rng.integers(1, 9))
            assert upload(a["gateway_url"], "late", 1, c, tokens[c], t, w).status_code == 202
            sent.append((t, w))
        deadline = time.monotonic() + 60
        while api.get("/v1/jobs/late").json()["completed"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        h = api.get("/v1/jobs/late").json()["history"][0]
        assert h["state"] == "expired" and h["published"] and h["received"] == 2
        assert h["closing"] == "deadline"
        m = httpx.get(
            f"{urls['n1']}/v1/jobs/late/model", headers={"Authorization": f"Bearer {secret}"}
        )
        want = sum(w * t["a"].astype(np.float64) for t, w in sent) / sum(w for _, w in sent)
        got = load(m.content)["a"]
        assert np.abs(got - want).max() / np.abs(want).max() <= 1e-6

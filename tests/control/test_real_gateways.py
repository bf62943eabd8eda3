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
from core.auth import bearer
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
        r = realgw.create_job(api, w0, job="real", rounds=2, goal=4, clients=8)
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
        assert job["history"][0]["aggregated"] == 4  # the root's own count of the model
        # round 2 opens once its plan reached the gateways (the view shows round 1 until then)
        job["round"] = _wait_view(api, "real", lambda v: v["round"]["number"] == 2)["round"]
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
    offset = [0.0]  # the deadline passes when the test moves the control plane's clock
    coord = Coordinator(urls, mc=2.0, admin_token=secret, clock=lambda: time.time() + offset[0])
    w0 = {"a": np.zeros(32, np.float32)}
    rng = np.random.default_rng(5)
    with control_client(coord, secret, tick_s=0.05) as api:
        r = realgw.create_job(api, w0, job="late", rounds=2, goal=4, clients=4, deadline_s=60.0)
        tokens = r.json()["tokens"]
        assert r.json()["round"]["clients_per_node"] == {"n1": 2, "n2": 2}
        sent, seen, held = [], set(), []
        for c in ("c0", "c1", "c2", "c3"):
            a = api.get("/v1/jobs/late/assignment", params={"client": c}).json()
            if a["node"] in seen:
                held.append((c, a["gateway_url"]))
                continue  # one update per node: the goal of 4 is never reached
            seen.add(a["node"])
            t = {"a": rng.standard_normal(32).astype(np.float32)}
            w = int(rng.integers(1, 9))
            assert upload(a["gateway_url"], "late", 1, c, tokens[c], t, w).status_code == 202
            sent.append((t, w))
        _wait_view(api, "late", lambda v: sum(v["round"]["received"].values()) == 2)
        offset[0] += 61.0
        deadline = time.monotonic() + 60
        while api.get("/v1/jobs/late").json()["completed"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        h = api.get("/v1/jobs/late").json()["history"][0]
        assert h["state"] == "expired" and h["published"] and h["received"] == 2
        assert h["closing"] == "deadline"
        # an update after the deadline is refused with a clear 409 and changes nothing
        c, url = held[0]
        t = {"a": rng.standard_normal(32).astype(np.float32)}
        late = upload(url, "late", 1, c, tokens[c], t, 3)
        assert late.status_code == 409, late.text
        assert late.json()["error"] == "stale_round" and "round 1" in late.json()["detail"]
        m = httpx.get(
            f"{urls['n1']}/v1/jobs/late/model", headers={"Authorization": f"Bearer {secret}"}
        )
        want = sum(w * t["a"].astype(np.float64) for t, w in sent) / sum(w for _, w in sent)
        got = load(m.content)["a"]
        assert np.abs(got - want).max() / np.abs(want).max() <= 1e-6


def _wait_view(api, job, pred, timeout=60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        view = api.get(f"/v1/jobs/{job}").json()
        if pred(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def test_a_round_short_of_its_minimum_is_reopened_then_closes_with_what_arrived(real_gateways):
    """Nothing by the first deadline: the round gets another one (``reopened`` 1), the
    gateways stay on it; two updates in the second window meet the minimum of 2 and the round
    closes at that deadline with exactly them (the FedAvg of the two). The deadlines pass
    when the test moves the control plane's clock, so a loaded machine cannot make the
    uploads miss their window."""
    urls, secret = real_gateways
    offset = [0.0]
    coord = Coordinator(urls, mc=2.0, admin_token=secret, clock=lambda: time.time() + offset[0])
    w0 = {"a": np.zeros(16, np.float32)}
    rng = np.random.default_rng(7)
    with control_client(coord, secret, tick_s=0.05) as api:
        r = realgw.create_job(
            api,
            w0,
            job="again",
            rounds=1,
            goal=4,
            clients=4,
            deadline_s=60.0,
            min_updates=2,
            on_shortfall="reopen",
            max_reopens=1,
        )
        tokens = r.json()["tokens"]
        offset[0] += 61.0  # the first deadline passes with nothing
        view = _wait_view(api, "again", lambda v: v["round"]["reopened"] == 1)
        assert view["round"]["state"] == "open" and view["completed"] == 0 and not view["failed"]
        sent, seen = [], set()
        for c in ("c0", "c1", "c2", "c3"):
            a = api.get("/v1/jobs/again/assignment", params={"client": c}).json()
            if a["node"] in seen:
                continue
            seen.add(a["node"])
            t = {"a": rng.standard_normal(16).astype(np.float32)}
            w = int(rng.integers(1, 9))
            assert upload(a["gateway_url"], "again", 1, c, tokens[c], t, w).status_code == 202
            sent.append((t, w))
        _wait_view(api, "again", lambda v: sum(v["round"]["received"].values()) == 2)
        offset[0] += 61.0  # the second deadline passes with the minimum
        view = _wait_view(api, "again", lambda v: v["completed"] == 1)
        h = view["history"][0]
        assert (h["state"], h["received"], h["closing"], h["published"]) == (
            "expired",
            2,
            "deadline",
            True,
        )
        assert h["aggregated"] == 2
        m = httpx.get(
            f"{urls['n1']}/v1/jobs/again/model", headers={"Authorization": f"Bearer {secret}"}
        )
        want = sum(w * t["a"].astype(np.float64) for t, w in sent) / sum(w for _, w in sent)
        assert np.abs(load(m.content)["a"] - want).max() / np.abs(want).max() <= 1e-6


def test_a_round_short_of_its_minimum_fails_the_job_and_no_gateway_waits(real_gateways):
    """``on_shortfall="fail"``: one update of a minimum of 2 by the deadline fails the job with
    a reason; the gateways drop the job (none keeps the round open), the assignment answers
    409 ``job_failed``, a late upload is refused, and no round opens after it."""
    urls, secret = real_gateways
    offset = [0.0]  # the deadline passes when the test moves the control plane's clock
    coord = Coordinator(urls, mc=2.0, admin_token=secret, clock=lambda: time.time() + offset[0])
    w0 = {"a": np.zeros(16, np.float32)}
    with control_client(coord, secret, tick_s=0.05) as api:
        r = realgw.create_job(
            api,
            w0,
            job="short",
            rounds=3,
            goal=4,
            clients=4,
            deadline_s=60.0,
            min_updates=2,
            on_shortfall="fail",
        )
        tokens = r.json()["tokens"]
        a = api.get("/v1/jobs/short/assignment", params={"client": "c0"}).json()
        t = {"a": np.ones(16, np.float32)}
        assert upload(a["gateway_url"], "short", 1, "c0", tokens["c0"], t, 1).status_code == 202
        _wait_view(api, "short", lambda v: sum(v["round"]["received"].values()) == 1)
        offset[0] += 61.0
        view = _wait_view(api, "short", lambda v: v["failed"])
        assert view["failed"] == "round 1: 1 of its minimum 2 update(s) arrived by the deadline"
        assert view["round"]["state"] == "failed" and view["completed"] == 0
        assert view["history"][-1]["state"] == "failed" and view["history"][-1]["received"] == 1
        admin = {"Authorization": f"Bearer {secret}"}
        for url in urls.values():  # no gateway keeps the round open
            assert httpx.get(f"{url}/v1/jobs/short", headers=admin).status_code == 404
        # a late upload is refused before its body is read: the gateway no longer knows the
        # job, so no client token of it verifies (the clear status is the control plane's)
        r = upload(a["gateway_url"], "short", 1, "c1", tokens["c1"], t, 1)
        assert r.status_code == 401, r.text
        r = api.get("/v1/jobs/short/assignment", params={"client": "c1"})
        assert r.status_code == 409 and r.json()["error"] == "job_failed"
        assert "1 of its minimum 2" in r.json()["detail"]
        r = api.post("/v1/jobs/short/rounds")
        assert r.status_code == 409 and r.json()["error"] == "job_failed"
        time.sleep(0.5)  # the control loop keeps running: no round 2 opens
        assert api.get("/v1/jobs/short").json()["round"]["number"] == 1


def test_a_gateway_that_missed_the_plan_push_gets_it_again_and_the_round_completes(
    real_gateways,
):
    """Round 2's plan does not reach n2 (a gateway restarting when it was sent, as the soak
    saw): n2 opens the round on its own plan, which refuses the clients the control plane
    placed there (409 ``wrong_node``). The next poll sees n2 run another plan version and
    sends it again, once; the round then completes long before its deadline."""
    from control_plane.errors import GatewayError

    urls, secret = real_gateways
    coord = Coordinator(urls, mc=2.0, admin_token=secret)
    pushes: list[tuple[str, int]] = []
    real_put = coord.clients["n2"].put_plan

    async def flaky_put(job: str, round_: int, slots):  # type: ignore[no-untyped-def]
        pushes.append((job, round_))
        if round_ == 2 and pushes.count((job, 2)) == 1:
            raise GatewayError("n2", "connection refused (restarting)")
        return await real_put(job, round_, slots)

    coord.clients["n2"].put_plan = flaky_put  # type: ignore[method-assign]
    w0 = {"a": np.zeros(16, np.float32)}
    rng = np.random.default_rng(3)
    with control_client(coord, secret, tick_s=0.05) as api:
        r = realgw.create_job(
            api, w0, job="repush", rounds=2, goal=4, clients=4, overprovision=1.0, deadline_s=120.0
        )
        tokens = r.json()["tokens"]
        t0 = time.monotonic()
        for rnd in (1, 2):
            _wait_view(api, "repush", lambda v, rnd=rnd: v["round"]["number"] == rnd)
            if rnd == 2:  # n2 on round 2 without its plan: a few polls of the control plane
                while (
                    httpx.get(f"{urls['n2']}/v1/jobs/repush", headers=bearer(secret)).json()[
                        "round"
                    ]
                    < 2
                ):
                    time.sleep(0.02)
                time.sleep(0.5)
            for c in ("c0", "c1", "c2", "c3"):
                deadline = time.monotonic() + 30
                while True:  # as a client that is refused asks again
                    a = api.get("/v1/jobs/repush/assignment", params={"client": c}).json()
                    t = {"a": rng.standard_normal(16).astype(np.float32)}
                    res = upload(a["gateway_url"], "repush", rnd, c, tokens[c], t, 1)
                    if res.status_code == 202:
                        break
                    assert res.json()["error"] in ("wrong_node", "round_not_open"), res.text
                    assert time.monotonic() < deadline, res.text
                    time.sleep(0.05)
        view = _wait_view(api, "repush", lambda v: v["done"])
        assert [h["state"] for h in view["history"]] == ["closed", "closed"]
        assert time.monotonic() - t0 < 60  # not at the 120 s deadline
        assert pushes.count(("repush", 2)) == 2, pushes  # the failed push, then one more
        assert pushes.count(("repush", 1)) == 1, pushes  # a plan that arrived: never again
        while (  # n2 follows the root's publication of round 2 a moment later
            httpx.get(f"{urls['n2']}/v1/jobs/repush", headers=bearer(secret)).json()["version"] < 2
        ):
            assert time.monotonic() - t0 < 60
            time.sleep(0.02)


def test_an_async_buffer_applies_at_exactly_k_updates_over_both_nodes(real_gateways):
    """FedBuff applies every K updates. The control plane selects more clients than K
    (``overprovision``) and spreads them over both gateways, whose own capacities follow the
    clients placed on them; six uploads racing for a buffer of K = 3 get exactly three
    places (the journal counts them over all nodes), the others a 409 saying why, and
    version 1 is FedBuff's step from exactly those three."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from client.sdk import ASYNC_KEY

    urls, secret = real_gateways
    coord = Coordinator(urls, mc=2.0, admin_token=secret)
    w0 = {"a": np.full(64, 0.5, np.float32)}
    rng = np.random.default_rng(11)
    updates = {f"c{i}": {"a": rng.standard_normal(64).astype(np.float32)} for i in range(6)}
    spec = {"eta": 0.8}
    with control_client(coord, secret, tick_s=0.05) as api:
        r = api.post(
            "/v1/jobs",
            json={
                "job": "buf",
                "rounds": 1,
                "goal": 3,
                "clients": list(updates),
                "overprovision": 2.0,
                "policy": "leastconn",
                "weights_b64": base64.b64encode(
                    save(w0, metadata={ASYNC_KEY: json.dumps(spec)})
                ).decode(),
            },
        )
        assert r.status_code == 201, r.text
        tokens = r.json()["tokens"]
        assert r.json()["round"]["clients_per_node"] == {"n1": 3, "n2": 3}
        where = {
            c: api.get("/v1/jobs/buf/assignment", params={"client": c}).json()["gateway_url"]
            for c in updates
        }

        def send(c: str) -> httpx.Response:
            return upload(where[c], "buf", 1, c, tokens[c], updates[c], 5)

        with ThreadPoolExecutor(6) as pool:
            answers = dict(zip(updates, pool.map(send, updates), strict=True))
        first = sorted(c for c, a in answers.items() if a.status_code == 202)
        assert len(first) == 3, {c: a.text for c, a in answers.items()}
        for c, a in answers.items():  # refused: the buffer was full, closing, or applied
            if c not in first:
                assert a.status_code == 409, a.text
                assert a.json()["error"] in ("round_full", "round_closed", "job_finished")
        view = _wait_view(api, "buf", lambda v: v["completed"] >= 1)
        assert view["history"][0]["aggregated"] == 3
        m = httpx.get(f"{urls['n1']}/v1/jobs/buf/model", headers=bearer(secret))
        assert m.headers["X-Model-Version"] == "1", m.text
        x = w0["a"].astype(np.float64)
        want = x + spec["eta"] / 3 * sum(updates[c]["a"] - x for c in first)
        assert np.abs(load(m.content)["a"] - want).max() <= 1e-5


def test_a_dp_job_spends_its_budget_round_by_round_and_stops_before_passing_it(real_gateways):
    """Issue 15, item 3: a DP-FedAvg job's epsilon, as the control plane accounts it after
    each round (the view and ``/metrics``), is dp-accounting's own RDP computation for the
    job's sampling rate and noise multiplier; the round that would pass the budget never
    opens, the job ends saying why, and opening it by hand is refused."""
    import json

    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from client.sdk import AGGREGATION_KEY

    urls, secret = real_gateways
    coord = Coordinator(urls, mc=3.0, admin_token=secret)
    z, delta, q = 1.0, 1e-5, 4 / 10  # 4 of 10 clients a round

    def library(rounds: int) -> float:
        acc = RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        acc.compose(event, rounds)
        return float(acc.get_epsilon(delta))

    budget = (library(2) + library(3)) / 2  # two rounds fit, a third would not
    spec = {
        "rule": "dp-fedavg",
        "clip": 1.0,
        "noise_multiplier": z,
        "delta": delta,
        "epsilon": budget,
        "shards": 2,
    }
    w0 = {"a": np.zeros(256, np.float32)}
    rng = np.random.default_rng(3)
    with control_client(coord, secret, tick_s=0.05) as api:
        r = api.post(
            "/v1/jobs",
            json={
                "job": "dp",
                "rounds": 5,
                "goal": 4,
                "clients": 10,
                "overprovision": 1.0,
                "weights_b64": base64.b64encode(
                    save(w0, metadata={AGGREGATION_KEY: json.dumps(spec)})
                ).decode(),
            },
        )
        assert r.status_code == 201, r.text
        tokens = r.json()["tokens"]
        assert r.json()["privacy"]["epsilon"] == pytest.approx(library(1), rel=1e-9)
        for rnd in (1, 2):
            view = _wait_view(api, "dp", lambda v, n=rnd: (v["round"] or {}).get("number") == n)
            for c in (f"c{i}" for i in range(10)):
                a = api.get("/v1/jobs/dp/assignment", params={"client": c})
                if a.status_code != 200:
                    continue
                up = {"a": rng.standard_normal(256).astype(np.float32)}
                # round 2 shows open once the root published; a node that follows it opens
                # it at its next journal poll (a raw upload before then: round_not_open)
                realgw.wait_round_open(a.json()["gateway_url"], "dp", rnd, secret)
                res = upload(a.json()["gateway_url"], "dp", rnd, c, tokens[c], up, 5)
                assert res.status_code == 202, res.text
            view = _wait_view(api, "dp", lambda v, n=rnd: v["completed"] >= n)
        view = _wait_view(api, "dp", lambda v: v["done"])
        assert view["completed"] == 2 and not view["failed"]
        assert view["stopped"].startswith("privacy budget: round 3 would bring epsilon to")
        p = view["privacy"]
        assert p["rounds"] == 2 and p["sampling_rates"] == [q] and p["budget"] == budget
        assert p["epsilon"] == pytest.approx(library(2), rel=1e-9)
        assert f"{library(3):.4g}" in view["stopped"]
        a = api.get("/v1/jobs/dp/assignment", params={"client": "c0"})
        assert a.status_code == 409 and a.json()["error"] == "privacy_budget_spent"
        refused = api.post("/v1/jobs/dp/rounds")
        assert refused.status_code == 409 and refused.json()["error"] == "privacy_budget_spent"
        metrics = api.get("/metrics")
        assert metrics.status_code == 200
        lines = dict(
            line.rsplit(" ", 1) for line in metrics.text.splitlines() if line.startswith("fedfaas_")
        )
        assert float(lines['fedfaas_control_job_privacy_epsilon{job="dp"}']) == pytest.approx(
            library(2), rel=1e-9
        )
        assert float(lines['fedfaas_control_job_privacy_budget{job="dp"}']) == budget
        assert float(lines['fedfaas_control_job_rounds_completed{job="dp"}']) == 2
        # the gateways keep the job's last model
        m = httpx.get(f"{urls[view['root']]}/v1/jobs/dp/model", headers=bearer(secret))
        assert m.headers["X-Model-Version"] == "2"
        anonymous = api.get("/metrics", headers={"Authorization": "Bearer not-a-token"})
        assert anonymous.status_code == 401 and anonymous.json()["error"]

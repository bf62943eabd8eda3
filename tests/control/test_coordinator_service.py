"""The coordinator's HTTP API against node-gateway processes on loopback."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from control_plane.coordinator import Coordinator
from control_plane.store import RedisStore
from tests.control import realgw
from tests.polling import wait_until
from tests.tokens import control_client

pytestmark = pytest.mark.integration


def make_client(gws, store=None, tick=0.05) -> TestClient:
    coord = Coordinator({g.name: g.url for g in gws}, mc=4.0, store=store, health_failures=2)
    return control_client(coord, tick_s=tick)


def upload(url: str, job: str, rnd: int, client: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/jobs/{job}/rounds/{rnd}/updates", params={"client": client}, content=b"x" * 16
    )


def test_round_opens_assigns_selected_clients_and_closes_at_goal(gateways):
    with make_client(gateways) as api:
        r = api.post("/v1/jobs", json={"job": "j1", "rounds": 2, "goal": 6, "clients": 10})
        assert r.status_code == 201, r.text
        rnd = r.json()["round"]
        assert rnd["number"] == 1 and rnd["state"] == "open" and rnd["selected"] == 8  # ceil(6*1.3)
        # BestFit with MC=4 per node: 8 clients fill two nodes, the third stays empty
        assert sorted(rnd["clients_per_node"].values()) == [4, 4]
        assigned = {}
        for c in (f"c{i}" for i in range(10)):
            a = api.get("/v1/jobs/j1/assignment", params={"client": c})
            if a.status_code == 200:
                assigned[c] = a.json()
            else:
                assert a.status_code == 409 and a.json()["error"] == "client_not_selected"
        assert len(assigned) == 8
        plan = api.get("/v1/jobs/j1/plan").json()
        assert sum(s["goal"] for s in plan["slots"] if s["role"] == 1) == 8
        for c, a in list(assigned.items())[:6]:
            assert upload(a["gateway_url"], "j1", 1, c).status_code == 202
        # the next round shows once its plan reached the gateways, a moment after the close
        job = realgw.completed(api, "j1", 1, 15, next_open=True)
        assert job["history"][0]["state"] == "closed" and job["history"][0]["received"] == 6
        assert job["round"]["number"] == 2 and job["round"]["state"] == "open"
        # a late update of round 1: the coordinator no longer assigns it, the gateway rejects it
        late_client, late = list(assigned.items())[7]
        nxt = api.get("/v1/jobs/j1/assignment", params={"client": late_client})
        assert nxt.status_code in (200, 409)  # selected again for round 2 or not
        first_r2 = next(
            c
            for c in (f"c{i}" for i in range(10))
            if api.get("/v1/jobs/j1/assignment", params={"client": c}).status_code == 200
        )
        a2 = api.get("/v1/jobs/j1/assignment", params={"client": first_r2}).json()
        assert upload(a2["gateway_url"], "j1", 2, first_r2).status_code == 202
        stale = upload(a2["gateway_url"], "j1", 1, late_client)
        assert stale.status_code == 409 and stale.json()["error"] == "stale_round"


def test_a_dead_gateway_leaves_placement_and_the_round_completes_on_the_others(own_gateways):
    gateways = own_gateways
    with make_client(gateways) as api:
        r = api.post(
            "/v1/jobs",
            json={"job": "j2", "rounds": 1, "goal": 6, "clients": 12, "overprovision": 1.5},
        )
        assert r.status_code == 201
        per_node = r.json()["round"]["clients_per_node"]
        victim = max(per_node, key=per_node.get)
        gw = {g.name: g for g in gateways}
        # one update reaches the victim before it dies: it is written off
        assigned = {}
        for c in (f"c{i}" for i in range(12)):
            a = api.get("/v1/jobs/j2/assignment", params={"client": c})
            if a.status_code == 200:
                assigned[c] = a.json()
        on_victim = [c for c, a in assigned.items() if a["node"] == victim]
        assert upload(gw[victim].url, "j2", 1, on_victim[0]).status_code == 202
        wait_until(lambda: api.get("/v1/jobs/j2").json()["round"]["received"].get(victim) == 1, 15)
        gw[victim].kill()
        nodes = wait_until(
            lambda: (
                (n := api.get("/v1/nodes").json())
                and not next(x for x in n["nodes"] if x["name"] == victim)["healthy"]
                and n
            ),
            15,
        )
        assert sum(1 for x in nodes["nodes"] if x["healthy"]) == 2
        # the node shows unhealthy as soon as the probe fails; its clients move once the
        # coordinator has asked the survivors to take over its jobs (these gateways cannot)
        rnd = wait_until(
            lambda: (
                victim not in (r := api.get("/v1/jobs/j2").json()["round"])["clients_per_node"]
                and r
            ),
            15,
        )
        assert rnd["lost"] == 1
        assert api.get("/v1/jobs/j2/plan").json()["slots"]
        assert all(s["node"] != victim for s in api.get("/v1/jobs/j2/plan").json()["slots"])
        sent = 0
        for c in assigned:
            if c == on_victim[0] or sent == 6:
                continue
            a = api.get("/v1/jobs/j2/assignment", params={"client": c}).json()
            assert a["node"] != victim
            assert upload(a["gateway_url"], "j2", 1, c).status_code == 202
            sent += 1
        job = realgw.completed(api, "j2", 1, 15)
        assert job["done"] and job["history"][0] == {
            **job["history"][0],
            "state": "closed",
            "received": 6,
            "lost": 1,
        }


def test_round_expires_at_its_deadline_with_what_arrived(gateways):
    offset = [0.0]  # the deadline passes when the test moves the control plane's clock
    coord = Coordinator(
        {g.name: g.url for g in gateways[:1]}, mc=4.0, clock=lambda: time.time() + offset[0]
    )
    with control_client(coord, tick_s=0.05) as api:
        api.post(
            "/v1/jobs", json={"job": "j3", "rounds": 1, "goal": 3, "clients": 3, "deadline_s": 60}
        )
        a = api.get("/v1/jobs/j3/assignment", params={"client": "c0"}).json()
        assert upload(a["gateway_url"], "j3", 1, "c0").status_code == 202
        wait_until(
            lambda: sum(api.get("/v1/jobs/j3").json()["round"]["received"].values()) == 1, 15
        )
        offset[0] += 61.0
        job = realgw.completed(api, "j3", 1, 15)
        assert job["history"][0]["state"] == "expired" and job["history"][0]["received"] == 1
        # the job is done: the assignment sends the client to the node with the final model
        r = api.get("/v1/jobs/j3/assignment", params={"client": "c0"})
        assert r.status_code == 200 and r.json()["done"] and r.json()["round"] == 1


@pytest.mark.parametrize(
    "method,path,body,status,code",
    [
        (
            "post",
            "/v1/jobs",
            {"job": "bad name!", "rounds": 1, "goal": 1, "clients": 1},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 0, "goal": 1, "clients": 1},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": ["x", "x"]},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": ["ok", "not ok"]},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": 1, "weights_b64": "@@"},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "Upper", "rounds": 1, "goal": 1, "clients": 1},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": 1, "policy": "random"},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": 1, "overprovision": 0.5},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 1, "clients": -1},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 2, "clients": 3, "min_updates": 3},
            422,
            "invalid_input",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 2, "clients": 3, "on_shortfall": "wait"},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 2, "clients": 3, "max_reopens": -1},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "a", "rounds": 1, "goal": 2, "clients": 3, "selection": "fastest"},
            422,
            "invalid_request",
        ),
        (
            "post",
            "/v1/jobs",
            {"job": "dup", "rounds": 1, "goal": 1, "clients": 2},
            409,
            "job_exists",
        ),
        ("get", "/v1/jobs/nope", None, 404, "unknown_job"),
        ("get", "/v1/jobs/nope/assignment?client=c0", None, 404, "unknown_job"),
        ("get", "/v1/jobs/dup/assignment", None, 422, "invalid_request"),
        ("get", "/v1/jobs/dup/assignment?client=ghost", None, 409, "client_not_selected"),
        ("post", "/v1/jobs/dup/rounds", None, 409, "round_state"),
        ("post", "/v1/jobs/dup/rounds/7/close", None, 409, "round_state"),
        ("delete", "/v1/jobs/nope", None, 404, "unknown_job"),
    ],
)
def test_bad_input_gets_a_clear_4xx_json_error(gateways, method, path, body, status, code):
    with make_client(gateways[:1], tick=0) as api:
        assert (
            api.post(
                "/v1/jobs", json={"job": "dup", "rounds": 1, "goal": 1, "clients": 2}
            ).status_code
            == 201
        )
        r = getattr(api, method)(path, **({"json": body} if body is not None else {}))
        assert r.status_code == status, r.text
        assert r.json()["error"] == code and r.json()["detail"]


def test_job_state_survives_a_coordinator_restart_through_redis(gateways, redis_url):
    with make_client(
        gateways, store=RedisStore(redis_url, redis_url.credentials_file("control-plane")), tick=0
    ) as api:
        r = api.post("/v1/jobs", json={"job": "keep", "rounds": 3, "goal": 4, "clients": 8})
        before = r.json()["round"]
        a = api.get("/v1/jobs/keep/assignment", params={"client": "c1"})
    with make_client(
        gateways, store=RedisStore(redis_url, redis_url.credentials_file("control-plane")), tick=0
    ) as api:
        after = api.get("/v1/jobs/keep").json()["round"]
        assert after["clients_per_node"] == before["clients_per_node"]
        assert api.get("/v1/jobs/keep/assignment", params={"client": "c1"}).json() == a.json()
        assert api.get("/v1/jobs/keep/plan").status_code == 200

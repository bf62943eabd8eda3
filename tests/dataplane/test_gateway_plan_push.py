"""Plans pushed by the control plane and early round closes, on a real gateway.

``PUT /v1/jobs/{job}/rounds/{r}/plan`` is validated (4xx JSON, nothing changes) and applied
mid-round without losing updates already handed to a leaf; ``POST .../close`` makes a round
aggregate what arrived. The model is flat FedAvg of the updates the round kept.
"""

from __future__ import annotations

import httpx
import pytest

from tests.aggregators import Aggregators
from tests.dataplane.rounds import (
    assert_fedavg,
    create,
    expected,
    post_update,
    upload,
    wait_version,
)

pytestmark = pytest.mark.integration


def slot(i: int, role: int, goal: int, parent: int | None, node: str = "n1") -> dict:
    return {"id": i, "node": node, "role": role, "goal": goal, "parent": parent}


def put(gw, rnd: int, body, token: str | None = "admin"):  # type: ignore[no-untyped-def]
    headers = {} if token is None else {"Authorization": f"Bearer {gw.gw.secret}"}
    kw = {"json": body} if not isinstance(body, bytes) else {"content": body}
    return httpx.put(f"{gw.url}/v1/jobs/j1/rounds/{rnd}/plan", headers=headers, **kw)


GOOD = {"slots": [slot(1, 3, 4, None), slot(2, 1, 2, 1), slot(3, 1, 2, 1)], "version": 1}


@pytest.mark.parametrize(
    ("body", "rnd", "token", "status", "code"),
    [
        ({"slots": [slot(1, 3, 4, None), slot(2, 1, 4, 1, "elsewhere")]}, 1, "a", 422, "bad_plan"),
        ({"slots": [slot(1, 3, 4, None), slot(2, 1, 3, 1)]}, 1, "a", 422, "bad_plan"),  # goals
        (
            {"slots": [slot(1, 3, 4, None), slot(2, 2, 2, 3), slot(3, 2, 2, 2)]},  # cycle
            1,
            "a",
            422,
            "bad_plan",
        ),
        ({"slots": [slot(1, 3, 9, None)]}, 1, "a", 422, "bad_plan"),  # more than the clients
        (
            {"slots": [slot(1, 3, 4, None)], "client_nodes": {"ghost": "n1"}},
            1,
            "a",
            422,
            "bad_plan",
        ),
        ({"slots": "nope"}, 1, "a", 422, "bad_plan"),
        (b"{not json", 1, "a", 400, "bad_json"),
        (GOOD, 1, None, 401, "unauthorized"),
        (GOOD, 0, "a", 409, "stale_round"),
        (GOOD, 5, "a", 409, "future_round"),
    ],
)
def test_a_bad_pushed_plan_gets_a_clear_4xx_and_changes_nothing(
    make_gw, body, rnd, token, status, code
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw()
    create(gw, [f"c{i}" for i in range(4)], 4)
    admin = {"Authorization": f"Bearer {gw.gw.secret}"}
    before = httpx.get(gw.url + "/v1/jobs/j1", headers=admin).json()
    r = put(gw, rnd, body, token)
    assert r.status_code == status, r.text
    assert r.json()["error"] == code and r.json()["detail"]
    after = httpx.get(gw.url + "/v1/jobs/j1", headers=admin).json()
    assert after["progress"]["slots"] == before["progress"]["slots"] and not after["pushed_plan"]


def test_plan_pushed_mid_round_keeps_delivered_updates_and_gives_flat_fedavg(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(pool=3)
    clients = [f"c{i}" for i in range(6)]
    info = create(gw, clients, 6)
    aggs = Aggregators(gw)
    try:
        aggs.start(3)
        p1 = {"slots": [slot(1, 3, 6, None), slot(2, 1, 3, 1), slot(3, 1, 3, 1)], "version": 1}
        assert put(gw, 1, p1).json()["applied"]
        seeds, weights = [10 + i for i in range(6)], [3 * i + 1 for i in range(6)]
        for i in range(2):
            upload(gw.url, info["tokens"], clients[i], 1, seeds[i], weights[i])
        # lowering leaf 2 under the 2 updates it holds would lose one: refused
        low = {"slots": [slot(1, 3, 6, None), slot(2, 1, 1, 1), slot(3, 1, 5, 1)]}
        r = put(gw, 1, low)
        assert r.status_code == 409 and r.json()["error"] == "plan_conflict"
        # re-plan: leaf 2 keeps its 2 updates (goal lowered to them), a new leaf 4 appears
        p2 = {
            "slots": [slot(1, 3, 6, None), slot(2, 1, 2, 1), slot(3, 1, 2, 1), slot(4, 1, 2, 1)],
            "version": 2,
        }
        r = put(gw, 1, p2)
        assert r.status_code == 200 and r.json()["applied"], r.text
        st = httpx.get(
            gw.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"}
        ).json()
        assert st["plan_version"] == 2 and st["progress"]["slots"]["2"]["updates"] == 2
        for i in range(2, 6):
            upload(gw.url, info["tokens"], clients[i], 1, seeds[i], weights[i])
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(seeds, weights))
    finally:
        aggs.stop()


def test_close_makes_the_round_aggregate_what_arrived(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(pool=3)
    clients = [f"c{i}" for i in range(5)]
    info = create(gw, clients, 5, rounds=2)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        seeds, weights = [40, 41], [5, 9]
        for c, s, w in zip(clients[:2], seeds, weights, strict=True):
            upload(gw.url, info["tokens"], c, 1, s, w)
        admin = {"Authorization": f"Bearer {gw.gw.secret}"}
        assert httpx.post(gw.url + "/v1/jobs/j1/rounds/1/close").status_code == 401
        bad = httpx.post(
            gw.url + "/v1/jobs/j1/rounds/1/close", headers=admin, json={"received": {"n1": -1}}
        )
        assert bad.status_code == 422 and bad.json()["error"] == "bad_close"
        wrong = httpx.post(
            gw.url + "/v1/jobs/j1/rounds/1/close", headers=admin, json={"received": {"n1": 3}}
        )
        assert wrong.status_code == 409 and wrong.json()["error"] == "plan_conflict"
        r = httpx.post(gw.url + "/v1/jobs/j1/rounds/1/close", headers=admin)
        assert r.status_code == 200, r.text
        assert r.json()["received"] == 2 and r.json()["applied"] and r.json()["goal"] == 2
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(seeds, weights))
        late = post_update(gw.url, "j1", 1, info["tokens"]["c3"], "c3", b"x", 1)
        assert late.status_code == 409 and late.json()["error"] == "stale_round"
    finally:
        aggs.stop()


def test_a_round_of_a_planned_job_waits_for_its_plan_before_taking_updates(make_gw) -> None:  # type: ignore[no-untyped-def]
    """Once the control plane planned a job here, a round that opens before its plan arrived
    (the push missed a restarting gateway, or has not come yet) takes no update: 409
    ``round_not_open`` (the SDK sends again) instead of updates landing in slots of the
    gateway's own plan that the pushed one would move (the soak's stuck rounds)."""
    gw = make_gw(pool=3)
    clients = [f"c{i}" for i in range(4)]
    info = create(gw, clients, 4, rounds=2)
    aggs = Aggregators(gw)
    admin = {"Authorization": f"Bearer {gw.gw.secret}"}
    plan = {"slots": [slot(1, 3, 4, None), slot(2, 1, 2, 1), slot(3, 1, 2, 1)], "version": 0}
    try:
        aggs.start(3)
        st = httpx.get(gw.url + "/v1/jobs/j1", headers=admin).json()
        assert not st["pushed_plan"]  # not planned by a control plane (yet): takes updates
        assert put(gw, 1, plan).json()["applied"]
        for i, c in enumerate(clients):
            upload(gw.url, info["tokens"], c, 1, 20 + i, 1 + i)
        wait_version(gw.url, info["tokens"]["c0"], 1)
        r = post_update(gw.url, "j1", 2, info["tokens"]["c0"], "c0", b"x" * 16, 1)
        assert r.status_code == 409 and r.json()["error"] == "round_not_open", r.text
        assert "control plane's plan" in r.json()["detail"]
        st = httpx.get(gw.url + "/v1/jobs/j1", headers=admin).json()
        assert st["round"] == 2 and not st["pushed_plan"] and st["received"] == 0
        assert put(gw, 2, plan).json()["applied"]
        seeds, weights = [30 + i for i in range(4)], [2 + i for i in range(4)]
        for i, c in enumerate(clients):
            upload(gw.url, info["tokens"], c, 2, seeds[i], weights[i])
        assert_fedavg(wait_version(gw.url, info["tokens"]["c0"], 2), expected(seeds, weights))
    finally:
        aggs.stop()

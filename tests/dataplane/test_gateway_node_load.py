"""What a node gateway's ``/healthz`` tells the autoscaler (``aggregators``), on real gateways,
routers, Redis and aggregator processes.

Regression: a non-root node whose part of a round was done (its partial sent to the root,
which had not published yet) still reported ``queue = k * E`` from the round's arrivals of the
last seconds, so the control plane scaled the ``aggregator`` function up for work that was
over (tests/platform/test_one_platform.py, the warm-replicas test, failed on it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bpf import Frame, Kind
from core import wire
from gateway.control import open_tasks
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, tiny_model
from tests.dataplane.rounds import post_update
from tests.dataplane.test_plan_and_engine import add_updates, engine
from tests.polling import wait_until

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1", "c2", "c3"]


def _upload(gw: GatewayThread, tokens: dict[str, str], client: str, seed: int) -> None:
    r = post_update(
        gw.url, "j1", 1, tokens[client], client, wire.encode_tensors(tiny_model(seed)), 1
    )
    assert r.status_code == 202, r.text


def _status(gw: GatewayThread, token: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.url}/v1/jobs/j1", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_a_node_whose_part_of_the_round_is_done_reports_no_queue(make_gw, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shared = tmp_path / "admin-secret"  # node gateways share the admin secret
    a = make_gw(node="a", fanout=2, pool=3, admin_secret_file=shared)
    b = make_gw(node="b", fanout=2, pool=3, peers={"a": a.url}, admin_secret_file=shared)
    r = httpx.post(
        a.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 4, "clients": ",".join(CLIENTS), "nodes": "a,b"},
        content=wire.encode_tensors(tiny_model(0)),
        headers={"Authorization": f"Bearer {a.gw.secret}"},
    )
    assert r.status_code == 201, r.text
    info = r.json()
    tokens, node_of = info["tokens"], info["plan"]["client_nodes"]
    on_a = [c for c in CLIENTS if node_of[c] == "a"]
    on_b = [c for c in CLIENTS if node_of[c] == "b"]
    assert len(on_a) == len(on_b) == 2, node_of
    wait_until(lambda: "j1" in b.gw.jobs)
    aggs_a, aggs_b = Aggregators(a), Aggregators(b)
    try:
        aggs_a.spawn(1, endpoints=2)
        aggs_b.spawn(1, endpoints=2)
        aggs_a.wait_registered(2)
        aggs_b.wait_registered(2)
        for i, c in enumerate(on_b):  # node b gets all of its updates; node a none yet
            _upload(b, tokens, c, 10 + i)

        def b_done() -> bool:
            slots = _status(b, tokens[on_b[0]])["progress"]["slots"].values()
            return all(s["done"] for s in slots if s["node"] == "b")

        wait_until(b_done)  # b's partial went to the root, which waits for a's clients
        job = _status(b, tokens[on_b[0]])
        assert job["version"] == 0 and job["k"] > 0 and job["E_s"] is not None, job
        health = httpx.get(b.url + "/healthz").json()["aggregators"]
        # nothing of the round is left to run on b: no queue, every endpoint free, idle
        assert health == {"endpoints": 2, "free_endpoints": 2, "waiting_slots": 0, "queue": 0.0}
        for i, c in enumerate(on_a):
            _upload(a, tokens, c, 20 + i)
        wait_until(lambda: _status(a, tokens[on_a[0]])["version"] == 1)
    finally:
        aggs_a.stop()
        aggs_b.stop()


def test_open_tasks_are_the_unfinished_slots_that_need_an_endpoint_of_their_own() -> None:
    eng, sent, _, store = engine(goal=4, fanout=2)  # one node: two leaves under the top
    assert open_tasks(eng) == 2  # the top waits for its children: it needs no endpoint yet
    add_updates(eng, store, range(4))
    eng.pump([5, 6])
    tasks = {f.seq: f for f in sent if f.kind == Kind.TASK}

    def finish(slot: int, kind: Kind = Kind.ACK) -> None:
        t = tasks[slot]
        eng.on_frame(
            Frame(
                dst=100,
                src=t.dst,
                kind=kind,
                job=7,
                key=t.key,
                weight=2,
                round=1,
                count=t.count,
                seq=slot,
            )
        )

    leaves = sorted(tasks)
    finish(leaves[0])
    assert open_tasks(eng) == 1  # the other leaf; the top still waits for it
    finish(leaves[1])
    assert open_tasks(eng) == 1  # the top, runnable now
    sent.clear()
    eng.pump([5])
    [top] = [f for f in sent if f.kind == Kind.TASK]
    tasks[top.seq] = top
    finish(top.seq, Kind.RESULT)
    assert eng.result is not None and open_tasks(eng) == 0

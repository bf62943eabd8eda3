"""End to end: rounds in the real MinIO, engine + tracker + cache functions on the real runtime."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from bench.harness.flstore_stack import FLStoreStack
from bench.harness.synthetic import History, write_history
from cache_engine.cold_store import MinioColdStore
from tests.flstore.rounds import direct
from tests.flstore.tracker_queries import ended

pytestmark = pytest.mark.integration
JOB = "e2e-job"


@pytest.fixture(scope="module")
def history(cold: MinioColdStore, stack: FLStoreStack) -> History:
    h = write_history(cold, JOB, 4, per_round=6, pool=20, malicious=["c003"], seed=1)
    stack.ingest(JOB, range(0, 5))
    stack.wait_idle()
    return h


def _ask(stack: FLStoreStack, body: dict, wait: bool = True) -> httpx.Response:
    return httpx.post(
        f"{stack.tracker_url}/v1/queries",
        headers=stack.auth,
        params={"wait": str(wait).lower()},
        json=body,
        timeout=120,
    )


def test_sign_flipping_client_is_flagged_by_a_query_served_from_cache(
    stack: FLStoreStack, history: History, cold: MinioColdStore
) -> None:
    body = {"workload": "cosine-to-aggregate", "job": JOB, "rounds": [2], "params": {"bottom_k": 1}}
    r = _ask(stack, body)
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["status"] == "done" and rec["hit"] is True  # round 2 was hot after ingestion
    assert rec["result"]["flagged"] == ["c003"]
    # the engine knows the replica's own address on the embedded runtime: one hop, not two
    assert [s["via"] for s in rec["tried"]] == ["direct"], rec["tried"]
    # the record, written while the answer went back, is there by its id
    again = httpx.get(f"{stack.tracker_url}/v1/queries/{rec['id']}", headers=stack.auth)
    assert again.status_code == 200 and again.json()["result"] == rec["result"]
    expected = direct(cold, body)
    for c, v in expected["cosine"].items():
        assert rec["result"]["cosine"][c] == pytest.approx(v, rel=1e-6)


def test_provenance_shares_sum_to_one_across_rounds(stack: FLStoreStack, history: History) -> None:
    r = _ask(
        stack, {"workload": "provenance", "job": JOB, "params": {"first_round": 1, "last_round": 4}}
    )
    assert r.status_code == 200, r.text
    shares = r.json()["result"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-4)
    assert set(shares) == {c for cl in history.clients.values() for c in cl}


def test_async_query_is_tracked_in_redis_until_done(stack: FLStoreStack, history: History) -> None:
    r = _ask(
        stack, {"workload": "multi-krum", "job": JOB, "rounds": [3], "params": {"f": 1}}, wait=False
    )
    assert r.status_code == 202
    qid = r.json()["id"]
    rec = ended(stack, qid)
    assert rec["status"] == "done"
    assert "c003" not in rec["result"]["selected"]
    assert rec["tried"][-1]["outcome"] == "ok"
    # kept for result_ttl (an hour) to be read back; an answered query's record only briefly
    r = stack.redis.client()
    try:
        assert 3000 < r.ttl(f"flstore:query:{qid}") <= 3600
        answered = _ask(
            stack, {"workload": "multi-krum", "job": JOB, "rounds": [3], "params": {"f": 1}}
        ).json()
        # an answered query's record is written while the answer goes back (the tracker serves
        # it from memory meanwhile): it may land in Redis just after the answer
        key, deadline = f"flstore:query:{answered['id']}", time.monotonic() + 30
        while r.ttl(key) == -2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0 < r.ttl(key) <= 60
    finally:
        r.close()


def test_every_cached_object_has_a_primary_and_a_secondary(
    stack: FLStoreStack, history: History
) -> None:
    stack.wait_idle()
    counts = httpx.get(f"{stack.engine_url}/v1/replicas", headers=stack.auth).json()
    assert counts and all(n == 2 for n in counts.values())
    state = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
    assert len(state["functions"]) >= 2


def test_p2_query_prefetches_the_next_round(stack: FLStoreStack, history: History) -> None:
    r = _ask(stack, {"workload": "kmeans", "job": JOB, "rounds": [1], "params": {"k": 2}})
    assert r.status_code == 200, r.text
    stack.wait_idle()
    locs = httpx.get(
        f"{stack.engine_url}/v1/locations",
        headers=stack.auth,
        params={"ids": [f"{JOB}/2/{c}" for c in history.clients[2]]},
    ).json()
    assert all(len(v) == 2 for v in locs.values())


BAD = [
    ({"workload": "no-such", "job": JOB, "rounds": [1]}, 404, "unknown_workload"),
    ({"workload": "multi-krum", "job": "no-such-job", "rounds": [1]}, 404, "unknown_job"),
    ({"workload": "multi-krum", "job": JOB, "rounds": [9]}, 404, "round_not_written"),
    (
        {"workload": "personalize", "job": JOB, "rounds": [1], "clients": ["zz9"]},
        404,
        "unknown_client",
    ),
    (
        {"workload": "multi-krum", "job": JOB, "rounds": [1], "params": {"f": -1}},
        422,
        "invalid_params",
    ),
    (
        {"workload": "multi-krum", "job": JOB, "rounds": [1], "params": {"bogus": 1}},
        422,
        "invalid_params",
    ),
    ({"workload": "multi-krum", "job": JOB, "rounds": "one"}, 422, "invalid_params"),
    ({"workload": "multi-krum", "job": JOB, "rounds": [1], "extra": 1}, 422, "invalid_params"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD)
@pytest.mark.parametrize("wait", [True, False])
def test_bad_queries_get_a_clear_4xx_and_change_nothing(
    stack: FLStoreStack, history: History, body: dict, status: int, code: str, wait: bool
) -> None:

    stack.wait_idle()
    before = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
    r = stack.redis.client(decode_responses=True)
    queries_before = set(r.scan_iter("flstore:query:*"))
    resp = _ask(stack, body, wait=wait)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"] == code
    assert resp.json()["detail"]
    after = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
    assert after["objects"] == before["objects"]
    assert after["stats"].get("requests") == before["stats"].get("requests")
    # no record of this query: a key new since is an earlier test's answered query, whose
    # record is written just after its answer went back
    for key in set(r.scan_iter("flstore:query:*")) - queries_before:
        assert r.hget(key, "status") == "done", (key, r.hgetall(key))


def test_malformed_body_is_400(stack: FLStoreStack) -> None:
    r = httpx.post(
        f"{stack.tracker_url}/v1/queries?wait=true",
        content=b"{nope",
        headers={"content-type": "application/json", **stack.auth},
    )
    assert r.status_code == 400 and r.json()["error"] == "bad_json"
    r = httpx.post(f"{stack.tracker_url}/v1/queries?wait=true", headers=stack.auth, json=[1, 2])
    assert r.status_code == 400
    assert httpx.get(f"{stack.tracker_url}/v1/queries/nope", headers=stack.auth).status_code == 404


def test_health_and_metrics(stack: FLStoreStack) -> None:
    assert httpx.get(f"{stack.tracker_url}/healthz").json()["ok"]
    assert httpx.get(f"{stack.engine_url}/healthz").json()["ok"]
    assert "flstore_tracker_" in httpx.get(f"{stack.tracker_url}/metrics", headers=stack.auth).text
    assert (
        "flstore_engine_objects"
        in httpx.get(f"{stack.engine_url}/metrics", headers=stack.auth).text
    )


def test_results_match_direct_computation_bitwise_close(
    stack: FLStoreStack, history: History, cold: MinioColdStore
) -> None:
    body = {"workload": "track", "job": JOB, "rounds": [4], "params": {"window": 3}}
    r = _ask(stack, body)
    assert r.status_code == 200, r.text
    got, exp = r.json()["result"], direct(cold, body)
    assert np.allclose(got["series"]["loss"], exp["series"]["loss"])


DIGITS = "e2e-digits"


@pytest.fixture(scope="module")
def digits(cold: MinioColdStore, stack: FLStoreStack) -> History:
    from bench.harness.synthetic import write_digits_history

    h = write_digits_history(cold, DIGITS, 2, per_round=5, pool=20, flip=["c001"], seed=2)
    stack.ingest(DIGITS, range(0, 3))
    stack.wait_idle()
    return h


def test_label_flipping_client_gets_the_lowest_shapley_value_via_the_job_evaluator(
    stack: FLStoreStack, digits: History, cold: MinioColdStore
) -> None:
    body = {"workload": "shapley", "job": DIGITS, "rounds": [2]}
    r = _ask(stack, body)
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    values = res["values"]
    assert min(values, key=values.get) == "c001"
    assert sum(values.values()) == pytest.approx(res["v_full"] - res["v_empty"], abs=1e-6)


def test_evaluator_workload_on_a_job_without_evaluator_is_a_clear_422(
    stack: FLStoreStack, history: History
) -> None:
    r = _ask(stack, {"workload": "leave-one-out", "job": JOB, "rounds": [2]})
    assert r.status_code == 422 and r.json()["error"] == "no_evaluator"


@pytest.mark.parametrize(
    "body",
    [
        # bodies no other test asks: asked again, the tracker would answer with the kept answer
        {"workload": "track", "job": JOB, "rounds": [4], "params": {"window": 4}},
        {"workload": "oort", "job": JOB, "params": {"round": 5, "k": 3, "seed": 1}},
    ],
    ids=["track", "oort"],
)
def test_metadata_queries_are_answered_by_the_engine_as_a_cache_function_answers_them(
    stack: FLStoreStack, history: History, cold: MinioColdStore, body: dict
) -> None:
    """Issue 16, item 3: a query that reads only rounds' metadata is answered by the cache
    engine from the metadata it read when it ingested those rounds (no hop to a cache
    function), and the answer is the one a cache function holding the same objects gives, and
    the direct computation's."""

    def answered_here() -> int:
        state = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth, timeout=10).json()
        return int(state["stats"]["answered_here"])

    before = answered_here()
    r = _ask(stack, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["function"] is None and answer["tried"] == [] and answer["hit"]
    assert answer["plan_kept"] is False
    assert answered_here() == before + 1
    assert answer["result"] == direct(cold, body)
    # the same workload in a cache function, on the same objects (the engine loads them)
    acquired = httpx.post(
        f"{stack.engine_url}/v1/plan", headers=stack.auth, json=body, timeout=30
    ).json()  # the objects the query reads
    objects = acquired["objects"]
    assert objects and all(o.endswith("/meta") for o in objects)
    fn = f"{stack.engine_settings.get('function_prefix', 'flstore-cache-')}0"
    load = httpx.post(
        f"{stack.runtime_url}/function/{fn}/load",
        headers=stack.function_auth,
        json={"objects": objects, "credentials": cold.job_credentials({body["job"]})},
        timeout=60,
    )
    assert load.status_code == 200, load.text
    ran = httpx.post(
        f"{stack.runtime_url}/function/{fn}/run",
        headers=stack.function_auth,
        json={"workload": body["workload"], "params": acquired["params"], "objects": objects},
        timeout=60,
    )
    assert ran.status_code == 200, ran.text
    assert ran.json()["result"] == answer["result"]

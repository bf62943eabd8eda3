"""The request tracker's kept plans (issue 16, item 3): a query asked again goes straight to a
cache function holding its objects, without the call to the engine; every change the engine
publishes voids the kept plans; a plan gone stale falls back to the engine; the engine's policy
still sees every request (``/v1/touch``); the engine routes the tracker calls check their input.
Real runtime, engine, tracker, Redis and MinIO."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.harness.flstore_stack import FLStoreStack
from bench.harness.synthetic import History, write_history
from cache_engine.cold_store import MinioColdStore
from core.services import MinioServer, RedisServer
from tests.flstore.conftest import start_stack
from tests.flstore.tracker_queries import ask

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`
JOB = "kept-job"
QUERY = {"workload": "multi-krum", "job": JOB, "rounds": [1], "params": {"f": 1}}


@pytest.fixture(scope="module")
def history(cold: MinioColdStore, stack: FLStoreStack) -> History:
    h = write_history(cold, JOB, 3, per_round=5, pool=10, seed=3)
    stack.ingest(JOB, range(0, 3))
    stack.wait_idle()
    return h


def _engine_stats(stack: FLStoreStack) -> dict:
    state = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth, timeout=10).json()
    stats: dict = state["stats"]
    return stats


def _kept(stack: FLStoreStack, body: dict) -> dict:
    """Ask ``body`` until it is answered on a kept plan (the first asking keeps the plan,
    unless a change message from the engine's background work voided it meanwhile)."""
    stack.wait_idle()
    for _ in range(5):
        out = ask(stack, body)
        if out["plan_kept"]:
            return out
    raise AssertionError(f"no kept plan after 5 askings: {out}")


def test_a_query_asked_again_goes_straight_to_a_holder_and_the_engine_still_sees_it(
    stack: FLStoreStack, history: History
) -> None:
    stack.wait_idle()
    first = ask(stack, QUERY)
    assert first["plan_kept"] is False and first["engine_s"] is not None
    again = _kept(stack, QUERY)
    assert again["tried"][0]["plan"] == "kept" and again["tried"][0]["outcome"] == "ok"
    assert again["engine_s"] is None and again["hit"] and again["loaded"] == 0
    assert again["result"] == first["result"]
    # the engine did not plan it, and its policy was told of it all the same
    stack.wait_idle()
    before = _engine_stats(stack)
    third = ask(stack, QUERY)
    assert third["plan_kept"] is True
    stack.wait_idle()  # the touch goes out within TOUCH_DELAY_S
    after = _engine_stats(stack)
    assert after["touched"] == before["touched"] + 1
    assert after["requests"] == before["requests"] + 1
    assert after["hits"] == before["hits"] + 1


def test_a_metadata_query_asked_again_is_answered_by_the_tracker_itself(
    stack: FLStoreStack, history: History
) -> None:
    body = {"workload": "track", "job": JOB, "rounds": [2], "params": {"window": 2}}
    first = ask(stack, body)
    assert first["function"] is None and first["plan_kept"] is False  # the engine answered
    answered = _engine_stats(stack)["answered_here"]
    again = _kept(stack, body)
    assert again["function"] is None and again["tried"] == []
    assert again["result"] == first["result"]
    assert _engine_stats(stack)["answered_here"] == answered  # the engine was not asked


def test_a_change_the_engine_publishes_voids_the_kept_plans_of_its_job(
    stack: FLStoreStack, history: History, cold: MinioColdStore
) -> None:
    """Another job's rounds leave this job's plans kept; a round of this job voids them."""
    _kept(stack, QUERY)
    write_history(cold, f"{JOB}-other", 1, per_round=3, pool=5, seed=4)
    stack.ingest(f"{JOB}-other", [0, 1])
    stack.wait_idle()
    assert ask(stack, QUERY)["plan_kept"] is True
    stack.ingest(JOB, [2])  # the catalog of this job is written again, and the engine says so
    stack.wait_idle()
    assert ask(stack, QUERY)["plan_kept"] is False


def test_a_kept_plan_whose_holder_lost_the_objects_falls_back_to_the_engine(
    stack: FLStoreStack, history: History
) -> None:
    """Every holder forgets the objects behind the engine's back (no change message): the
    kept plan's calls get 409 not_held, and the tracker plans with the engine as before."""
    kept = _kept(stack, QUERY)
    objects = httpx.post(
        f"{stack.engine_url}/v1/plan", headers=stack.auth, json=QUERY, timeout=30
    ).json()["objects"]
    holders = httpx.get(
        f"{stack.engine_url}/v1/locations", headers=stack.auth, params={"ids": objects}
    ).json()
    for fn in {f for fs in holders.values() for f in fs}:
        gone = httpx.post(
            f"{stack.runtime_url}/function/{fn}/evict",
            headers=stack.function_auth,
            json={"objects": objects},
            timeout=30,
        )
        assert gone.status_code == 200 and gone.json()["evicted"], gone.text
    out = ask(stack, QUERY)
    on_kept = [t for t in out["tried"] if t.get("plan") == "kept"]
    assert on_kept and all(t["outcome"] == "http_409" for t in on_kept)
    assert out["plan_kept"] is False and out["tried"][-1]["outcome"] == "ok"
    assert out["result"] == kept["result"]


def test_touch_wants_a_credential_and_a_list_of_queries(
    stack: FLStoreStack, history: History
) -> None:
    url = f"{stack.engine_url}/v1/touch"
    assert httpx.post(url, json={"queries": [QUERY]}).status_code == 401
    for bad in ({"queries": "multi-krum"}, {"queries": [1]}, {}, {"queries": [QUERY] * 1001}):
        r = httpx.post(url, headers=stack.auth, json=bad)
        assert r.status_code == 400 and r.json()["error"] == "bad_touch", r.text
    r = httpx.post(url, headers=stack.auth, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"] == "bad_json"
    # a query the engine cannot plan, or whose objects are not all held, is not counted
    unknown = {"workload": "multi-krum", "job": "no-such-job", "rounds": [1]}
    r = httpx.post(url, headers=stack.auth, json={"queries": [unknown]})
    assert r.status_code == 200 and r.json() == {"counted": 0}


@pytest.fixture(scope="module")
def stack_without_reuse(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, minio_server: MinioServer
) -> Iterator[FLStoreStack]:
    s = start_stack(
        Path(tmp_path_factory.mktemp("no-reuse")),
        redis_server,
        minio_server,
        {"ping_interval": 0.5},
        {"plan_reuse": False},
    )
    try:
        yield s
    finally:
        s.stop()


def test_without_plan_reuse_every_query_asks_the_engine(
    stack_without_reuse: FLStoreStack, cold: MinioColdStore
) -> None:
    s = stack_without_reuse
    write_history(cold, JOB, 3, per_round=5, pool=10, seed=3)
    s.ingest(JOB, range(0, 3))
    s.wait_idle()
    answers = [ask(s, QUERY) for _ in range(3)]
    assert [a["plan_kept"] for a in answers] == [False] * 3
    assert all(a["engine_s"] is not None for a in answers)


def test_a_report_of_missing_objects_wants_a_list_of_object_ids(
    stack: FLStoreStack, history: History
) -> None:
    url = f"{stack.engine_url}/v1/functions/flstore-cache-0/missing"
    assert httpx.post(url, json={"objects": []}).status_code == 401
    for bad in ({}, {"objects": "kept-job/1/c000"}, {"objects": [1]}, {"objects": ["nope"]}):
        r = httpx.post(url, headers=stack.auth, json=bad)
        assert r.status_code == 400 and r.json()["error"] == "bad_request", r.text
    r = httpx.post(url, headers=stack.auth, json={"objects": []})
    assert r.status_code == 200 and r.json() == {"corrected": 0}

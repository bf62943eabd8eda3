"""The location table in memory and written through to a real Redis."""

from __future__ import annotations

import pytest

from cache_engine.keys import global_model, meta, update
from cache_engine.table import LocationTable, RedisLocationTable, redis_lookup


def test_primary_first_then_secondaries_and_reverse_index() -> None:
    t = LocationTable()
    k = update("j", "a", 1)
    t.add(k, "flstore-cache-0")
    t.add(k, "flstore-cache-1")
    t.add(k, "flstore-cache-0")
    assert t.get(k) == ["flstore-cache-0", "flstore-cache-1"]
    assert t.keys_on("flstore-cache-1") == {k}
    t.discard(k, "flstore-cache-0")
    assert t.get(k) == ["flstore-cache-1"]


def test_dropping_a_function_reports_remaining_holders() -> None:
    t = LocationTable()
    a, b = update("j", "a", 1), global_model("j", 1)
    t.add(a, "f0")
    t.add(a, "f1")
    t.add(b, "f0")
    left = t.drop_function("f0")
    assert left == {a: ["f1"], b: []}
    assert t.get(a) == ["f1"] and t.get(b) == []
    assert len(t) == 1


@pytest.mark.integration
def test_redis_table_survives_an_engine_restart_and_serves_the_tracker(redis_url: str) -> None:

    r = redis_url.client("cache-engine", decode_responses=True)
    t = RedisLocationTable(r)
    keys = [update("job-1", "c1", 3), global_model("job-1", 3), meta("job-2", 0)]
    for k in keys:
        t.add(k, "flstore-cache-0")
        t.add(k, "flstore-cache-2")
    t.discard(keys[2], "flstore-cache-0")
    fresh = RedisLocationTable(r)
    assert fresh.load() == 3
    assert fresh.get(keys[0]) == ["flstore-cache-0", "flstore-cache-2"]
    assert fresh.get(keys[2]) == ["flstore-cache-2"]
    assert redis_lookup(r, keys + [update("job-1", "zz", 3)])[update("job-1", "zz", 3)] == []
    assert redis_lookup(r, keys)[keys[1]] == ["flstore-cache-0", "flstore-cache-2"]
    fresh.drop_function("flstore-cache-2")
    assert redis_lookup(r, keys)[keys[2]] == []
    assert r.smembers("flstore:fn:flstore-cache-0") == {keys[0].id, keys[1].id}


@pytest.mark.integration
def test_every_change_of_the_redis_table_is_published_for_the_tracker(redis_url: str) -> None:
    """Each write-through also publishes on CHANGES, which the request tracker's Redis user
    may follow (and no other channel); that voids its kept plans."""
    import redis as redis_lib

    from cache_engine.table import CHANGES

    with redis_url.client("request-tracker", decode_responses=True) as tr:
        sub = tr.pubsub()
        sub.subscribe(CHANGES)
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        with redis_url.client("cache-engine", decode_responses=True) as r:
            t = RedisLocationTable(r)
            k = update("job-p", "c1", 1)
            t.add(k, "flstore-cache-0")
            t.remove(k)
            t.add(k, "flstore-cache-1")
            t.drop_function("flstore-cache-1")
        got = []
        while (m := sub.get_message(timeout=2)) is not None:
            got.append(m["data"])
        # each change names its job; a function gone may touch any job's plans ("")
        assert got == ["job-p", "job-p", "job-p", "job-p", ""]
        sub.close()
        other = tr.pubsub()
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            other.subscribe("fedfaas:anything")
            other.get_message(timeout=2)
        other.close()
    with redis_url.client("gateway") as gw, pytest.raises(redis_lib.exceptions.NoPermissionError):
        gw.publish(CHANGES, "forged")


def test_the_tracker_follows_the_channel_the_engine_publishes_on() -> None:
    from cache_engine.service import MAX_TOUCH
    from cache_engine.table import CHANGES
    from request_tracker import engine, plans

    assert plans.CHANGES == CHANGES
    assert 0 < engine.TOUCH_BATCH <= MAX_TOUCH

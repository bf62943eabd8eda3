"""Pure tests of the cache policies: what each loads ahead, evicts and keeps."""

from __future__ import annotations

import pytest

from cache_engine.catalog import MemoryCatalog, neighbour_rounds
from cache_engine.keys import ObjectKey, global_model, meta, update
from cache_engine.policies import FIFO, LFU, LRU, Static, Tailored, infer_policy, make_policy


def _catalog(rounds: int = 6) -> MemoryCatalog:
    cat = MemoryCatalog()
    for r in range(1, rounds + 1):
        cat.add_round("j", r, ["a", "b", "c"] if r % 2 else ["a", "d", "e"])
    return cat


def test_object_key_round_trips_through_its_id_and_rejects_inconsistent_kinds() -> None:
    for k in (update("j-1", "c7", 3), global_model("j-1", 0), meta("j.x", 12)):
        assert ObjectKey.parse(k.id) == k
        assert ObjectKey.from_json(k.to_json()) == k
    with pytest.raises(ValueError):
        ObjectKey("j", 1, "update")
    with pytest.raises(ValueError):
        ObjectKey("j", 1, "global", "c1")
    with pytest.raises(ValueError):
        ObjectKey("j", -1, "meta")


def test_neighbour_rounds_find_previous_and_next_participation() -> None:
    assert neighbour_rounds([1, 4, 9], 4) == (1, 9)
    assert neighbour_rounds([1, 4, 9], 5) == (4, 9)
    assert neighbour_rounds([1, 4, 9], 1) == (None, 4)
    assert neighbour_rounds([1, 4, 9], 9) == (4, None)


def test_p2_request_loads_whole_round_and_next_then_evicts_older_rounds() -> None:
    cat = _catalog()
    p = Tailored(100, cat)
    d = p.on_request([update("j", "a", 2)], "P2")
    assert d.misses == [update("j", "a", 2)]
    assert set(d.prefetch) == {update("j", c, 2) for c in "de"} | {update("j", c, 3) for c in "abc"}
    d = p.on_request([update("j", "b", 3)], "P2")
    assert d.hit
    assert set(d.evict) == {update("j", c, 2) for c in "ade"}
    assert set(d.prefetch) == {update("j", c, 4) for c in "ade"}


def test_p2_keeps_the_latest_round_while_evicting_older_ones() -> None:
    cat = _catalog()
    p = Tailored(100, cat)
    p.on_round_complete("j", 6)
    p.on_request([update("j", "a", 1)], "P2")
    d = p.on_request([update("j", "a", 3)], "P2")
    assert update("j", "a", 1) in d.evict
    assert {update("j", c, 6) for c in "ade"} <= p.contents()


def test_p3_prefetches_the_clients_previous_and_next_rounds_and_drops_older_ones() -> None:
    cat = _catalog()
    p = Tailored(100, cat)
    d = p.on_request([update("j", "b", 3)], "P3")
    assert set(d.prefetch) == {update("j", "b", 1), update("j", "b", 5)}
    d = p.on_request([update("j", "b", 5)], "P3")
    assert d.hit
    assert update("j", "b", 1) in d.evict
    assert update("j", "b", 3) in p.contents()


def test_p4_keeps_metadata_of_the_last_r_rounds_from_ingestion() -> None:
    cat = MemoryCatalog()
    p = Tailored(1000, cat, meta_rounds=3)
    for r in range(1, 8):
        cat.add_round("j", r, ["a"])
        p.on_round_complete("j", r)
    metas = {k.round for k in p.contents() if k.kind == "meta"}
    assert metas == {5, 6, 7}
    assert p.on_request([meta("j", 5), meta("j", 6), meta("j", 7)], "P4").hit


def test_capacity_is_never_exceeded_by_prefetch_and_requested_keys_stay() -> None:
    cat = _catalog()
    p = Tailored(4, cat)
    d = p.on_request([update("j", "a", 2)], "P2")
    assert len(p) <= 4
    assert update("j", "a", 2) in p.contents()
    assert len(d.prefetch) == 3


def test_lru_fifo_lfu_evict_in_their_own_order() -> None:
    cat = _catalog()
    a, b, c = (global_model("j", r) for r in (1, 2, 3))
    order = {"lru": None, "fifo": None, "lfu": None}
    for cls in (LRU, FIFO, LFU):
        p = cls(2, cat)
        p.on_request([a])
        p.on_request([a])
        p.on_request([b])
        p.on_request([a])
        d = p.on_request([c])
        order[cls.name] = d.evict[0]
    assert order == {"lru": b, "fifo": a, "lfu": b}


def test_baselines_never_prefetch() -> None:
    cat = _catalog()
    for name in ("lru", "fifo", "lfu"):
        p = make_policy(name, 100, cat)
        assert p.on_request([update("j", "a", 1)], "P2").prefetch == []
        assert p.on_round_complete("j", 6).prefetch == []


def test_static_uses_p1_whatever_the_workload() -> None:
    p = Static(100, _catalog())
    assert p.on_request([update("j", "a", 1)], "P2").prefetch == []


def test_policy_is_inferred_from_the_keys_when_no_workload_says() -> None:
    assert infer_policy([meta("j", 1)]) == "P4"
    assert infer_policy([update("j", "a", 1), update("j", "b", 1)]) == "P2"
    assert infer_policy([update("j", "a", 1), update("j", "a", 2)]) == "P3"
    assert infer_policy([global_model("j", 1)]) == "P1"


def test_unknown_policy_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("mru", 10, _catalog())

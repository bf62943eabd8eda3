"""Hit rates of the policies on traces shaped like the paper's (10 of 250 clients per round)."""

from __future__ import annotations

from bench.harness.flstore_trace import (
    mixed_trace,
    p2_trace,
    p3_trace,
    p4_trace,
    repeated_trace,
    simulate,
)
from cache_engine.policies import make_policy


def test_p2_trace_reaches_99_percent_and_admit_on_miss_policies_cannot_hit() -> None:
    t = p2_trace()
    flstore = simulate(make_policy("flstore", 64, t.catalog), t)
    assert flstore.requests == 20000
    assert flstore.hit_rate >= 0.99
    assert flstore.misses == 1
    for name in ("lru", "fifo", "lfu"):
        assert simulate(make_policy(name, 64, t.catalog), t).hits == 0


def test_p3_trace_reaches_99_percent_with_one_cold_miss() -> None:
    t = p3_trace()
    r = simulate(make_policy("flstore", 64, t.catalog), t)
    assert r.requests >= 100
    assert r.misses == 1
    assert r.hit_rate >= 0.99
    assert r.peak_objects <= 3  # the client's previous, current and next round


def test_p4_trace_reaches_99_percent() -> None:
    t = p4_trace(rounds=5000, per_round_requests=1)
    r = simulate(make_policy("flstore", 64, t.catalog), t)
    assert r.hit_rate >= 0.99
    assert simulate(make_policy("lru", 64, t.catalog), t).hits == 0


def test_repeated_trace_gives_lru_a_fair_chance() -> None:
    t = repeated_trace(requests=5000)
    lru = simulate(make_policy("lru", 64, t.catalog), t)
    lfu = simulate(make_policy("lfu", 64, t.catalog), t)
    assert lru.hit_rate > 0.3 and lfu.hit_rate > 0.3


def test_tailored_beats_every_baseline_on_a_mixed_live_trace() -> None:
    t = mixed_trace(rounds=150)
    rates = {
        p: simulate(make_policy(p, 64, t.catalog), t).hit_rate
        for p in ("flstore", "lru", "fifo", "lfu", "static", "random")
    }
    assert rates["flstore"] >= 0.9
    assert all(rates["flstore"] >= v for v in rates.values())

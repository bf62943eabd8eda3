"""The cache engine's placement in coordinate parts, its memory budget, the offers it ends and
the evaluator functions it scales.

Real Redis; the cache functions are real handler modules called in process (the provider
double of ``test_engine.py``), each reporting the bytes it holds as its private memory (they
share this process, whose own ``RssAnon`` would say nothing about any one of them).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness.synthetic import write_history
from cache_engine.cold_store import MemoryColdStore, object_path
from cache_engine.engine import CacheEngine
from cache_engine.keys import ObjectKey
from cache_engine.parts import MAX_STREAM_BYTES, STREAM_BYTES, STREAM_FILL, STREAM_WORKERS
from core.auth import bearer
from core.openfaas import DeployResult, FunctionStatus
from flstore_workloads.sliced import part_bounds
from tests.polling import wait_until

from .test_engine import (
    FUNCTION_TOKEN,
    InProcessProvider,
    _engine,
    _engine_with_rounds,
    _model_bytes,
    _wait_idle,
)

pytestmark = pytest.mark.integration


class Provider(InProcessProvider):
    """The double, with each function's memory its held bytes, and a deployed evaluator."""

    def __init__(self, cold: MemoryColdStore) -> None:
        super().__init__(cold)
        self.scaled: list[tuple[str, int]] = []
        self.evaluator_replicas = 1
        #: bytes of working memory a function's requests hold now, beyond what it holds
        self.working: dict[str, int] = {}

    def deploy(self, body: dict[str, Any], **kw: Any) -> DeployResult:
        res = super().deploy(body, **kw)
        name = str(body["service"])
        mod = self.fns[name]
        mod._private_bytes = lambda: mod._used() + self.working.get(name, 0)
        return res

    def function(self, name: str) -> FunctionStatus | None:
        if name != "ev":
            return None
        n = self.evaluator_replicas
        return FunctionStatus(name, n, n, {"com.openfaas.scale.max": "8"})

    def scale(self, name: str, replicas: int) -> None:
        self.scaled.append((name, replicas))
        self.evaluator_replicas = replicas


def _start(redis_url: Any, cold: MemoryColdStore, **kw: Any) -> tuple[CacheEngine, Provider]:
    """An engine on :class:`Provider` (``test_engine._engine``)."""
    eng, prov = _engine(redis_url, cold, Provider(cold), **kw)
    return eng, prov  # type: ignore[return-value]


def _start_with_rounds(
    redis_url: Any, cold: MemoryColdStore, ingested: int = 5, **kw: Any
) -> tuple[Any, Provider]:
    """:func:`_start` with rounds 0 to ``ingested - 1`` of job ``j`` ingested, the engine idle."""
    eng, prov = _engine_with_rounds(redis_url, cold, Provider(cold), ingested, **kw)
    return eng, prov


@pytest.fixture()
def cold() -> MemoryColdStore:
    c = MemoryColdStore()
    write_history(c, "j", 4, per_round=4, pool=10, seed=5)
    return c


def _parts_on(prov: Provider, name: str) -> set[str]:
    return {i for i in prov.held(name) if "~" in i}


def test_a_round_too_big_for_a_function_is_placed_in_parts_one_copy_each(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    cap = 4 * _model_bytes(cold)  # a round (4 updates + its base) takes 5 models
    eng, prov = _start_with_rounds(
        redis_url, cold, function_capacity_bytes=cap, max_functions=12, ingested=3
    )
    try:
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [2]})
        ranges = plan["slices"]["ranges"]
        parts = ranges[0]["part"][1]
        assert len({r["function"] for r in ranges}) >= 2 and len(ranges) == parts
        assert plan["holders"] == [ranges[0]["function"]]
        for s, r in enumerate(ranges):  # part s of every model on the function of range s
            ids = {f"{o}~{s}.{parts}" for o in plan["objects"] if not o.endswith("/meta")}
            assert ids <= prov.held(r["function"])
            locs = eng.locations(sorted(ids))
            assert all(v == [r["function"]] for v in locs.values()), locs  # one copy
        for name, mod in prov.fns.items():
            assert mod._used() <= cap, name
        assert eng.stats["queries_in_parts"] == 1
        again = eng.acquire({"workload": "cosine-to-aggregate", "job": "j", "rounds": [2]})
        assert again["slices"]["ranges"] == ranges and again["loaded"] == 0  # shared
        # asked again on the tracker's kept plan: the policy still sees the request
        requests = eng.stats["requests"]
        assert eng.touch([{"workload": "multi-krum", "job": "j", "rounds": [2]}]) == 1
        assert eng.stats["requests"] == requests + 1
    finally:
        eng.stop()


def test_an_object_the_policy_evicts_goes_with_every_part_and_a_lost_part_comes_back(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    cap = 4 * _model_bytes(cold)
    eng, prov = _start_with_rounds(
        redis_url, cold, function_capacity_bytes=cap, max_functions=12, evict_grace=0
    )
    try:
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [1]})
        _wait_idle(eng)
        r1 = {f"j/1/{c}" for c in eng.catalog.clients("j", 1)}
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [3]})
        _wait_idle(eng)
        for f in prov.fns:  # P2 dropped round 1: its updates' parts went too
            assert not {i.split("~")[0] for i in _parts_on(prov, f)} & r1, f
        assert not [k for k in eng.table.objects() if k.whole.id in r1]
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [3]})
        victim = plan["slices"]["ranges"][-1]["function"]
        prov.dead.add(victim)
        assert eng.report_failure(victim) is False
        _wait_idle(eng)
        again = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [3]})
        assert victim not in {r["function"] for r in again["slices"]["ranges"]}
        for s, r in enumerate(again["slices"]["ranges"]):
            n = r["part"][1]
            ids = {f"{o}~{s}.{n}" for o in again["objects"] if not o.endswith("/meta")}
            assert ids <= prov.held(r["function"])
    finally:
        eng.stop()


def test_past_the_budget_nothing_is_loaded_and_the_plan_reads_minio(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    eng, prov = _start_with_rounds(
        redis_url, cold, node_memory_bytes=1, query_memory_bytes=0, ingested=3
    )
    try:
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [2]})
        assert plan["slices"]["source"]["credentials"] == {}  # the memory store has no users
        assert [r["part"] for r in plan["slices"]["ranges"]] == [None]
        assert STREAM_BYTES <= plan["slices"]["source"]["chunk_bytes"] <= MAX_STREAM_BYTES
        assert eng.stats["queries_streamed"] == 1 and eng.stats["loads_failed"] >= 1
        for f in prov.fns:
            assert not [i for i in prov.held(f) if not i.endswith("/meta")], f
    finally:
        eng.stop()


def test_the_budget_evicts_in_the_policys_order_before_it_streams(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    model = _model_bytes(cold)
    eng, prov = _start(
        redis_url,
        cold,
        node_memory_bytes=int(7.5 * model),  # one round (4 updates, base, meta), not two
        query_memory_bytes=0,
        secondaries=0,
        evict_grace=0,
    )
    try:
        eng.ingest("j", 0)
        eng.ingest("j", 1)
        _wait_idle(eng)
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [1]})
        eng.ingest("j", 2)
        _wait_idle(eng)
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [2]})
        assert "slices" not in plan  # placed whole, after evicting round 1 for room
        assert eng.stats["evicted_for_budget"] >= 1
        assert eng.budget.used() <= eng.budget.limit
    finally:
        eng.stop()


def test_an_offer_ends_once_the_rounds_placement_has_claimed_what_it_keeps(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    from core import wire
    from core.objstore import Namespace
    from core.objstore.handoff import HandoffServer

    g = cold.get(ObjectKey("j", 1, "global"))
    assert isinstance(g, np.ndarray)
    spec = wire.ModelSpec.build([("w", "F32", (g.shape[0],))])
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ns = Namespace(root, "n0", "j", spec.object_nbytes, pool=4)
    server = HandoffServer(root / "n0" / "handoff.sock")
    eng, prov = _start_with_rounds(redis_url, cold, secondaries=0, ingested=2)
    try:
        keys = {}
        for c in eng.catalog.clients("j", 2):
            obj = ns.allocate()
            wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=1, count=1, round=2)
            wire.flat_view(obj.buf, spec)[:] = 0
            wire.flat_view(obj.buf, spec)[: spec.numel] = cold.get(ObjectKey("j", 2, "update", c))
            keys[c] = obj.key_bytes
            obj.close()
            ns.seal(keys[c])
        ticket = server.offer(ns, "j", 2, spec.numel, spec.hash.hex(), keys, 300)
        eng.ingest("j", 2, {"socket": str(server.path), "ticket": ticket, "node": "n0"})
        _wait_idle(eng)
        deadline = time.monotonic() + 10
        while server.stats["ended"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.stats["ended"] == 1 and eng.stats["offers_ended"] == 1
        assert eng.stats["objects_handed_off"] == len(keys)  # the prefetch mapped them all
        for k in keys.values():  # the offer's lease is gone; the one holder's stays
            assert ns.leases(k) == 2
        accounted = eng.budget.describe()
        assert accounted["leased_bytes"] == len(keys) * eng._size(ObjectKey("j", 2, "update", "x"))
        assert not [i for i in eng.budget.leased if i.startswith("offer:")]
    finally:
        eng.stop()
        for mod in prov.fns.values():
            for c in list(mod._handoffs.values()):
                c.close()
        server.close()
        ns.close()


def test_a_jobs_evaluator_function_is_scaled_up_to_its_replicas(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    import json

    doc = json.loads(cold.get_bytes(ObjectKey("j", 0, "meta")))
    doc["round_meta"]["evaluator"] = {"kind": "function", "function": "ev", "replicas": 3}
    cold.put_bytes(ObjectKey("j", 0, "meta"), json.dumps(doc).encode())
    eng, prov = _start(redis_url, cold)
    try:
        eng.ingest("j", 0)
        eng.ingest("j", 1)
        _wait_idle(eng)
        assert prov.scaled == [("ev", 3)] and eng.stats["evaluators_scaled"] == 1
    finally:
        eng.stop()


def test_parts_past_the_budget_are_read_from_minio_the_others_held(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    model = _model_bytes(cold)
    eng, prov = _start_with_rounds(
        redis_url,
        cold,
        function_capacity_bytes=4 * model,  # a round (5 models) goes in 4 parts
        node_memory_bytes=int(2.8 * model),  # two of them, not four
        query_memory_bytes=0,
        secondaries=0,
        max_functions=12,
        ingested=3,
    )
    try:
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [2]})
        ranges = plan["slices"]["ranges"]
        edges = [b for r in ranges for b in r["bounds"]]  # the ranges cover the models in order
        assert edges[0] == 0 and edges[-1] == plan["slices"]["dim"]
        assert edges[1:-1:2] == edges[2:-1:2]
        held = [r for r in ranges if r["part"] is not None]
        streamed = [r for r in ranges if r["part"] is None]
        assert held and streamed
        for r in held:  # part s of every model on the function of its range
            s, n = r["part"]
            ids = {f"{o}~{s}.{n}" for o in plan["objects"] if not o.endswith("/meta")}
            assert ids <= prov.held(r["function"])
            assert list(part_bounds(plan["slices"]["dim"], n)[s]) == r["bounds"]
        # the parts not held are joined into contiguous ranges, read by a few functions
        assert len({r["function"] for r in streamed}) <= STREAM_WORKERS
        for x, y in zip(ranges, ranges[1:], strict=False):
            assert not (x["part"] is y["part"] is None and x["function"] == y["function"])
        assert "source" in plan["slices"] and eng.stats["queries_partly_streamed"] == 1
        chunk = plan["slices"]["source"]["chunk_bytes"]
        assert STREAM_BYTES <= chunk <= MAX_STREAM_BYTES
        # each reads at a time most of its share of the queries' working memory (the floor aside)
        share = eng.budget.working_room() // len({r["function"] for r in streamed})
        assert chunk <= max(STREAM_BYTES, int(share * STREAM_FILL))
        assert eng.budget.used() <= eng.budget.limit
    finally:
        eng.stop()


class HeldOpen:
    """A cold store whose read of one object waits until the test lets it go: a request under
    way on the function that reads it."""

    def __init__(self, cold: MemoryColdStore, key: ObjectKey) -> None:
        self.cold, self.key = cold, key
        self.reading, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cold, name)

    def get_bytes(self, key: ObjectKey) -> bytes:
        if key == self.key:
            self.reading.set()
            self.go.wait(60)
        return bytes(self.cold.get_bytes(key))


def test_a_requests_working_memory_evicts_nothing_the_queries_read(
    redis_url: Any, cold: MemoryColdStore
) -> None:
    """Issue 36's thrash at 120 updates: with a round's parts filling the loads' share of a
    budget below the round, a query's working memory (what ``query_memory_bytes`` is kept for)
    counted as FLStore holding too much; each ping round evicted parts for the budget, and the
    next query loaded them again. A function's working memory within the kept share now
    evicts nothing, and the query asked again loads nothing."""
    model = _model_bytes(cold)
    eng, prov = _start_with_rounds(
        redis_url,
        cold,
        function_capacity_bytes=4 * model,  # a round (5 models) goes in 4 parts
        node_memory_bytes=int(4.8 * model),  # two of them fit the loads' share, not four
        query_memory_bytes=2 * model,
        secondaries=0,
        max_functions=12,
        evict_grace=0,
        ingested=3,
    )
    query = {"workload": "multi-krum", "job": "j", "rounds": [2]}
    try:
        for _ in range(3):  # placed as the budget allows (the policy's evictions free room)
            plan = eng.acquire(query)
            _wait_idle(eng)
            if plan["loaded"] == 0:
                break
        assert plan["loaded"] == 0  # settled: asked again, the query loads nothing
        held = [r for r in plan["slices"]["ranges"] if r["part"] is not None]
        assert held and len(held) < len(plan["slices"]["ranges"])  # partly held, partly read
        assert eng.budget.room() < 1.5 * model  # a query's working memory would not fit it
        before, objects = dict(eng.stats), set(eng.table.objects())
        fn = held[0]["function"]
        gate = HeldOpen(cold, ObjectKey("j", 3, "meta"))
        prov.fns[fn].set_cold_store(gate)
        load = threading.Thread(
            target=prov.invoke,
            args=(fn,),
            kwargs={
                "path": "/load",
                "json": {"objects": [gate.key.id], "credentials": {}},
                "headers": bearer(FUNCTION_TOKEN),
            },
        )
        load.start()
        try:
            assert gate.reading.wait(30)  # a request under way on fn
            for working in (int(1.5 * model), int(1.5 * model) + 1):  # within the kept 2 models
                prov.working[fn] = working
                # seen by a ping round (the second: the first round's budget check is done)
                wait_until(
                    lambda w=working: eng.budget.private.get(fn, 0) >= prov.fns[fn]._used() + w,
                    30,
                    "the engine to see the working memory",
                )
        finally:
            prov.working[fn] = 0
            gate.go.set()
            load.join(30)
        assert eng.stats["evicted_for_budget"] == before["evicted_for_budget"]
        assert eng.stats["objects_evicted"] == before["objects_evicted"]
        assert objects <= set(eng.table.objects())
        again = eng.acquire(query)
        assert again["loaded"] == 0 and again["slices"]["ranges"] == plan["slices"]["ranges"]
    finally:
        eng.stop()


def test_a_part_held_but_for_the_base_models_slice_is_computed_where_it_is_held(
    redis_url: Any,
) -> None:
    """The policy placed a round's updates in parts; a query over the round adds its base
    model, whose parts the budget has no room for. Each part is still computed where its
    updates are held (its function reads the base's slice from the cold store), not the
    whole query read from MinIO (issue 36: 4 of 5 queries at 120 updates)."""
    cold = MemoryColdStore()
    write_history(cold, "k", 1, per_round=6, pool=6, seed=2)
    del cold.objects[object_path(ObjectKey("k", 1, "global"))]  # no other model to evict
    base = cold.get(ObjectKey("k", 0, "global"))
    assert isinstance(base, np.ndarray)
    model = int(base.nbytes)
    eng, prov = _start(
        redis_url,
        cold,
        function_capacity_bytes=4 * model,  # 6 updates (and the base) go in 4 parts
        query_memory_bytes=16 * model,
        secondaries=0,
        max_functions=12,
        evict_grace=0,
    )
    try:
        eng.ingest("k", 0)
        eng.ingest("k", 1)
        _wait_idle(eng)
        # the round filled the loads' share: no room for a part of the base (a quarter model)
        eng.budget.limit = eng.budget.used() + eng.budget.keep + model // 8
        plan = eng.acquire({"workload": "multi-krum", "job": "k", "rounds": [1]})
        ranges = plan["slices"]["ranges"]
        assert [r["part"] for r in ranges] == [[s, 4] for s in range(4)]
        for s, r in enumerate(ranges):  # each on the function holding its updates' parts
            ups = {f"{o}~{s}.4" for o in plan["objects"] if "/c" in o}
            assert len(ups) == 6 and ups <= prov.held(r["function"])
        assert "source" in plan["slices"]  # the base's slices from the cold store
        assert eng.stats["queries_partly_streamed"] == 1 and eng.stats["queries_streamed"] == 0
        base_parts = [k for k in eng.table.objects() if k.parts and k.whole.kind == "global"]
        assert not base_parts  # none loaded: no room
    finally:
        eng.stop()

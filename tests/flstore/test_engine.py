"""The cache engine's placement, capacity, eviction and replica restoration.

Real Redis; the cache functions are real handler modules called in process through a provider
double (one module instance per function, so each has its own memory), and the cold store is in
memory. The same paths run against the real runtime in test_e2e.py and test_fault.py.
"""

from __future__ import annotations

import importlib.util
import json as _json
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest

from bench.harness.synthetic import write_history
from cache_engine.cold_store import MemoryColdStore
from cache_engine.engine import CacheEngine
from cache_engine.errors import FunctionsUnavailable
from cache_engine.keys import ObjectKey
from cache_engine.settings import EngineSettings
from core.auth import bearer, write_token_file
from core.openfaas import FUNCTION_TOKEN_SECRET, DeployResult, OpenFaaSError

pytestmark = pytest.mark.integration
HANDLER = Path(__file__).resolve().parents[2] / "functions" / "flstore" / "handler.py"
FUNCTION_TOKEN = "engine-test-function-token"


class InProcessProvider:
    """Stands in for :class:`core.openfaas.OpenFaaS`: each function is a fresh instance of the
    real handler module (the engine's logic is under test here; tests/flstore/test_e2e.py runs
    the real runtime)."""

    def __init__(self, cold: MemoryColdStore) -> None:
        self.cold = cold
        self.fns: dict[str, ModuleType] = {}
        self.dead: set[str] = set()

    def deploy(self, body: dict[str, Any], **_: Any) -> DeployResult:
        name = str(body["service"])
        assert body["secrets"] == [FUNCTION_TOKEN_SECRET]  # the functions check the token
        # a module of the handler's package (its siblings are imported relatively), one per
        # function
        module = f"functions.flstore.handler_{name.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(module, HANDLER)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.set_cold_store(self.cold)
        self.fns[name] = mod
        return DeployResult(name, 202, "POST", "")

    def invoke(
        self,
        name: str,
        body: bytes | None = None,
        *,
        method: str = "POST",
        path: str = "",
        json: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        assert headers == bearer(FUNCTION_TOKEN)  # every call carries the function token
        if name in self.dead or name not in self.fns:
            raise OpenFaaSError(f"{name} is gone")
        ev = SimpleNamespace(
            method=method,
            path=path,
            body=_json.dumps(json).encode() if json is not None else b"",
            headers={},
            query={},
        )
        out = self.fns[name].handle(ev, SimpleNamespace(hostname=name))
        return httpx.Response(out["statusCode"], json=out["body"])

    def held(self, name: str) -> set[str]:
        return {k.id for k in self.fns[name]._objects}

    def function(self, name: str) -> object | None:
        """Whether ``name`` is deployed (its status stands in as an object), as the real
        client's ``function``."""
        return SimpleNamespace(name=name) if name in self.fns else None


def _engine(
    redis_url: str, cold: MemoryColdStore, provider: InProcessProvider | None = None, **kw: Any
) -> tuple[CacheEngine, InProcessProvider]:
    """A started engine on ``cold`` whose functions are ``provider``'s (default: an
    :class:`InProcessProvider`), with the settings ``kw``."""
    prov = provider or InProcessProvider(cold)
    token_file = write_token_file(Path(tempfile.mkdtemp()) / "function-token", FUNCTION_TOKEN)
    s = EngineSettings(redis_url=redis_url, ping_interval=0.1, function_token_file=token_file, **kw)
    eng = CacheEngine(s, redis_url.client("cache-engine", decode_responses=True), cold, prov)  # type: ignore[arg-type]
    eng.start()
    return eng, prov


def _wait_idle(eng: CacheEngine, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not eng.idle():
        assert time.monotonic() < deadline, "engine still busy"
        time.sleep(0.01)


@pytest.fixture()
def cold() -> MemoryColdStore:
    c = MemoryColdStore()
    write_history(c, "j", 4, per_round=4, pool=10, seed=5)
    return c


def _engine_with_rounds(
    redis_url: str,
    cold: MemoryColdStore,
    provider: InProcessProvider | None = None,
    ingested: int = 5,
    **kw: Any,
) -> tuple[Any, Any]:
    """:func:`_engine` with rounds 0 to ``ingested - 1`` of job ``j`` ingested and the engine
    idle."""
    eng, prov = _engine(redis_url, cold, provider, **kw)
    try:
        for r in range(0, ingested):
            eng.ingest("j", r)
        _wait_idle(eng)
    except BaseException:
        eng.stop()
        raise
    return eng, prov


def _model_bytes(cold: MemoryColdStore) -> int:
    g = cold.get(ObjectKey("j", 1, "global"))
    return int(g.nbytes)  # type: ignore[union-attr]


def test_functions_are_created_when_capacity_runs_out_and_never_overfilled(
    redis_url: str, cold: MemoryColdStore
) -> None:
    cap = 16 * _model_bytes(cold)
    eng, prov = _engine_with_rounds(
        redis_url, cold, function_capacity_bytes=cap, secondaries=1, max_functions=8
    )
    try:
        for q in (
            {"workload": "multi-krum", "job": "j", "rounds": [2]},
            {"workload": "foolsgold", "job": "j", "params": {"first_round": 1, "last_round": 3}},
        ):
            plan = eng.acquire(q)
            assert all(set(plan["objects"]) <= prov.held(f) for f in plan["holders"])
            _wait_idle(eng)
        assert len(prov.fns) > 2
        for name, mod in prov.fns.items():
            used = sum(int(getattr(v, "nbytes", 0)) for v in mod._objects.values())
            assert used <= cap, name
        counts = eng.replica_counts()  # co-locating a query may add copies beyond 1 + k
        assert all(n >= 2 for n in counts.values()), counts
    finally:
        eng.stop()


def test_policy_evictions_free_the_functions_memory(redis_url: str, cold: MemoryColdStore) -> None:
    eng, prov = _engine(redis_url, cold, secondaries=1)
    try:
        eng.ingest("j", 0)
        eng.ingest("j", 1)
        eng.ingest("j", 2)
        eng.ingest("j", 3)
        eng.ingest("j", 4)
        _wait_idle(eng)
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [1]})
        _wait_idle(eng)
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [3]})
        _wait_idle(eng)
        r1 = {f"j/1/{c}" for c in eng.catalog.clients("j", 1)}
        for f in prov.fns:
            assert not (r1 & prov.held(f)), f"{f} still holds round 1"
        r4 = {f"j/4/{c}" for c in eng.catalog.clients("j", 4)}  # latest round is kept
        assert sum(r4 <= prov.held(f) for f in prov.fns) == 2
    finally:
        eng.stop()


def test_a_dead_function_is_dropped_and_its_objects_get_two_holders_again(
    redis_url: str, cold: MemoryColdStore
) -> None:
    eng, prov = _engine_with_rounds(redis_url, cold, secondaries=1)
    try:
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [4]})
        victim = plan["holders"][0]
        _wait_idle(eng)
        lost = prov.held(victim)
        assert lost
        prov.dead.add(victim)
        assert eng.report_failure(victim) is False
        _wait_idle(eng)
        counts = eng.replica_counts()
        assert lost <= set(counts)
        assert all(n == 2 for n in counts.values()), counts
        assert all(victim not in eng.table.get(ObjectKey.parse(i)) for i in counts)
        assert len(prov.fns) == 3  # a new function took the dead one's share
    finally:
        eng.stop()


def test_a_query_while_the_functions_restart_is_asked_again_not_refused_for_good(
    redis_url: str, cold: MemoryColdStore
) -> None:
    """Every cache function down at once (the runtime's SIGKILL takes all its replicas) with
    the engine at its function cap: a query is answered 503 ``functions_unavailable`` (the SDK
    asks again), not 507 ``no_capacity`` (fault (d) of the campaign failed a query so), and is
    answered once the functions are back."""
    eng, prov = _engine_with_rounds(redis_url, cold, secondaries=0, max_functions=1)
    query = {"workload": "multi-krum", "job": "j", "rounds": [4]}
    try:
        assert len(prov.fns) == 1
        (fn,) = prov.fns
        prov.dead.add(fn)
        assert eng.report_failure(fn) is False
        with pytest.raises(FunctionsUnavailable) as err:
            eng.acquire(query)
        assert err.value.status == 503 and err.value.to_dict()["down"] == 1
        assert fn in err.value.detail
        prov.dead.clear()  # back: the liveness loop sees it answer again
        deadline = time.monotonic() + 30
        while not eng.functions[fn].alive:
            assert time.monotonic() < deadline, "the function was not seen alive again"
            time.sleep(0.05)
        _wait_idle(eng)
        plan = eng.acquire(query)
        assert plan["holders"] == [fn]
        assert set(plan["objects"]) <= prov.held(fn)
    finally:
        eng.stop()


def test_functions_a_restarted_runtime_no_longer_has_give_their_places_to_new_ones(
    redis_url: str, cold: MemoryColdStore
) -> None:
    """The runtime's functions do not survive its restart: the engine's dead functions that
    the provider no longer has are forgotten at the cap, and a query gets a new function
    (fault (d) of the campaign: after three runtime SIGKILLs every query was refused)."""
    eng, prov = _engine_with_rounds(redis_url, cold, secondaries=0, max_functions=1)
    query = {"workload": "multi-krum", "job": "j", "rounds": [4]}
    try:
        (fn,) = prov.fns
        prov.dead.add(fn)
        assert eng.report_failure(fn) is False
        del prov.fns[fn]  # the runtime restarted without it
        prov.dead.clear()
        # the loss queued a restore of the function's objects: it forgets the dead function and
        # deploys a new one in the background; a query during that deploy is answered 503
        # functions_unavailable (test above), so the query waits for the background to settle
        # (in CI the query raced the deploy and got the 503)
        _wait_idle(eng)
        plan = eng.acquire(query)
        assert len(plan["holders"]) == 1
        (new,) = plan["holders"]
        assert set(plan["objects"]) <= prov.held(new)
        assert list(eng.functions) == [new]
    finally:
        eng.stop()


class GatedProvider(InProcessProvider):
    """Holds the first ``/load`` until :attr:`release` is set (a load still under way)."""

    def __init__(self, cold: MemoryColdStore) -> None:
        super().__init__(cold)
        self.loading = threading.Event()
        self.release = threading.Event()
        self._gated = False

    def invoke(self, name: str, body: bytes | None = None, **kw: Any) -> httpx.Response:
        if kw.get("path") == "/load" and not self._gated:
            self._gated = True
            self.loading.set()
            assert self.release.wait(30)
        return super().invoke(name, body, **kw)


def test_objects_the_policy_evicts_while_they_load_are_freed_not_kept_forever(
    redis_url: str, cold: MemoryColdStore
) -> None:
    """A query's objects evicted by a concurrent query before their load lands: the engine
    does not index them (nothing would evict them again; the soak's cache functions grew
    without bound this way), and the function frees them after the grace."""
    prov = GatedProvider(cold)
    token_file = write_token_file(Path(tempfile.mkdtemp()) / "function-token", FUNCTION_TOKEN)
    s = EngineSettings(
        redis_url=redis_url,
        ping_interval=0.1,
        function_token_file=token_file,
        secondaries=0,
        capacity_objects=4,
        evict_grace=0.2,
    )
    eng = CacheEngine(s, redis_url.client("cache-engine", decode_responses=True), cold, prov)  # type: ignore[arg-type]
    eng.start()
    try:
        for r in range(0, 5):
            eng.catalog.add_round("j", r, cold.client_ids("j", r))
        first: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: first.update(
                eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [1]})
            )
        )
        t.start()
        assert prov.loading.wait(30)
        # another analyst's query needs the whole capacity: round 1's objects leave the policy
        eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [3]})
        prov.release.set()
        t.join(30)
        assert first["holders"], first  # the first query still got its objects
        _wait_idle(eng)
        r1 = set(first["objects"])
        assert r1 and not r1 & {k.id for k in eng.table.objects()}
        assert set(eng.table.objects()) <= eng.policy.contents()
        for f in prov.fns:
            assert not (r1 & prov.held(f)), f"{f} still holds round 1"
        assert eng.describe()["stats"]["evicted_while_loading"] == len(r1)
    finally:
        prov.release.set()
        eng.stop()


def test_acquire_held_answers_a_held_query_as_acquire_does_and_leaves_a_miss_untouched(
    redis_url: str, cold: MemoryColdStore
) -> None:
    """The service answers a query whose objects are held on its event loop
    (``acquire_held``); a miss gets None there and nothing changes (no request counted, no
    load), so the thread pool's ``acquire`` does it once."""
    eng, prov = _engine_with_rounds(redis_url, cold, secondaries=0)
    try:
        held = {"workload": "multi-krum", "job": "j", "rounds": [4]}  # the latest: prefetched
        before = dict(eng.stats)
        out = eng.acquire_held(held)
        assert out is not None and out["hit"] is True and out["holders"]
        assert set(out["objects"]) <= prov.held(out["holders"][0])
        assert eng.stats["requests"] == before["requests"] + 1
        cold_q = {"workload": "multi-krum", "job": "j", "rounds": [1]}  # evicted by then
        if eng.acquire_held(cold_q) is None:
            assert eng.stats["requests"] == before["requests"] + 1  # nothing counted
            assert eng.stats["objects_loaded"] == before["objects_loaded"]
            plan = eng.acquire(cold_q)
            assert plan["hit"] is False and plan["loaded"] > 0
        else:
            pytest.fail("round 1 should not be held after round 4's prefetch")
    finally:
        eng.stop()


def test_objects_a_function_says_it_lacks_get_their_copies_back(
    redis_url: str, cold: MemoryColdStore
) -> None:
    """A function restarted under its name answers 409 not_held before the liveness loop sees
    its new incarnation; the tracker reports the objects missing, and the engine copies them
    to 1 + k holders again (the restore on the new incarnation no longer finds them)."""
    eng, prov = _engine_with_rounds(redis_url, cold, secondaries=1)
    try:
        plan = eng.acquire({"workload": "multi-krum", "job": "j", "rounds": [4]})
        _wait_idle(eng)
        victim = plan["holders"][0]
        prov.fns[victim]._objects.clear()  # its memory is gone
        assert eng.report_missing(victim, plan["objects"]) == len(plan["objects"])
        _wait_idle(eng)
        counts = eng.replica_counts()
        assert all(counts[o] == 2 for o in plan["objects"]), counts
        for f in eng.locations(plan["objects"]).values():
            assert len(f) == 2
    finally:
        eng.stop()

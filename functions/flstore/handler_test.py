"""Unit tests of the FLStore cache function's routes (in-memory cold store, no server)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cache_engine.cold_store import MemoryColdStore

from . import handler


def _call(method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
    ev = SimpleNamespace(method=method, path=path, body=raw, headers={}, query={})
    res = handler.handle(ev, SimpleNamespace(hostname="test"))
    return res["statusCode"], res["body"]


@pytest.fixture()
def store() -> MemoryColdStore:
    s = MemoryColdStore()
    rng = np.random.default_rng(0)
    for r in (0, 1):
        ups = {
            c: {
                "w": rng.normal(size=(4, 3)).astype(np.float32),
                "b": rng.normal(size=3).astype(np.float32),
            }
            for c in ("a", "b", "c")
        }
        s.write_round(
            "job",
            r,
            ups if r else {},
            {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)},
            {c: {"n_samples": 10} for c in ups},
            {"lr": 0.1},
        )
    handler.set_cold_store(s)
    handler._objects.clear()
    yield s
    handler.set_cold_store(None)
    handler._objects.clear()


def test_load_list_and_evict_track_holdings_and_memory(store: MemoryColdStore) -> None:
    code, body = _call("POST", "/load", {"objects": ["job/1/a", "job/1/global", "job/1/meta"]})
    assert code == 200 and sorted(body["loaded"]) == ["job/1/a", "job/1/global", "job/1/meta"]
    assert body["bytes"] >= 2 * 15 * 4
    code, body = _call("POST", "/load", {"objects": ["job/1/a"]})
    assert body["already"] == ["job/1/a"]
    code, body = _call("GET", "/objects")
    assert {o["id"] for o in body["objects"]} == {"job/1/a", "job/1/global", "job/1/meta"}
    code, body = _call("POST", "/evict", {"objects": ["job/1/a", "job/1/zz"]})
    assert body["evicted"] == ["job/1/a"] and body["count"] == 2


def test_loaded_update_is_the_flat_vector_in_sorted_name_order(store: MemoryColdStore) -> None:
    _call("POST", "/load", {"objects": ["job/1/b"]})
    from safetensors.numpy import load

    from cache_engine.keys import update

    t = load(store.objects["job/rounds/000001/clients/b.safetensors"])
    np.testing.assert_array_equal(
        handler._objects[update("job", "b", 1)], np.concatenate([t["b"].ravel(), t["w"].ravel()])
    )


def test_bad_input_gets_4xx_json_and_changes_nothing(store: MemoryColdStore) -> None:
    assert _call("POST", "/load", b"{not json")[0] == 400
    assert _call("POST", "/load", {"objects": "job/1/a"})[0] == 400
    assert _call("POST", "/load", {"objects": ["nonsense"]})[0] == 400
    code, body = _call("POST", "/load", {"objects": ["job/7/a"]})
    assert code == 404 and body["error"] == "object_missing"
    assert _call("DELETE", "/objects")[0] == 404
    assert _call("GET", "/ping")[1]["count"] == 0


def test_run_refuses_objects_it_does_not_hold(store: MemoryColdStore) -> None:
    code, body = _call("POST", "/run", {"workload": "x", "params": {}, "objects": ["job/1/a"]})
    assert code == 409 and body["missing"] == ["job/1/a"]


def test_ping_counts_the_runs_in_flight(
    store: MemoryColdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside, release = threading.Event(), threading.Event()

    def held_query(body: dict[str, Any]) -> dict[str, Any]:  # a /run that stays in flight
        inside.set()
        release.wait(30)
        return {"statusCode": 200, "body": {}, "headers": {}}

    assert _call("GET", "/ping")[1]["runs_in_flight"] == 0
    monkeypatch.setattr(handler, "_run_query", held_query)
    run = threading.Thread(target=_call, args=("POST", "/run", {"workload": "x"}))
    run.start()
    try:
        assert inside.wait(10)
        assert _call("GET", "/ping")[1]["runs_in_flight"] == 1
    finally:
        release.set()
        run.join(10)
    assert _call("GET", "/ping")[1]["runs_in_flight"] == 0
    monkeypatch.undo()  # a run that fails (409, not held) leaves the count as it was
    assert _call("POST", "/run", {"workload": "x", "params": {}, "objects": ["job/1/a"]})[0] == 409
    assert _call("GET", "/ping")[1]["runs_in_flight"] == 0


def test_run_executes_a_registered_workload_on_held_data(store: MemoryColdStore) -> None:
    import flstore_workloads as wl
    from cache_engine.catalog import MemoryCatalog
    from cache_engine.queries import Query, plan

    cat = MemoryCatalog()
    for r in store.rounds("job"):
        cat.add_round("job", r, store.round_meta("job", r)["clients"])
    name = next(
        n
        for n, w in wl.WORKLOADS.items()
        if w.policy == "P2" and "round" in w.params_model.model_fields
    )
    p = plan(Query(name, "job", [1]), cat)
    _call("POST", "/load", {"objects": [k.id for k in p.keys]})
    code, body = _call(
        "POST", "/run", {"workload": name, "params": p.params, "objects": [k.id for k in p.keys]}
    )
    assert code == 200, body
    assert body["result"]["workload"] == name


_CHURN = r"""
import importlib, json, os, sys, threading
from types import SimpleNamespace
import numpy as np
from cache_engine.cold_store import MemoryColdStore

h = importlib.import_module(sys.argv[1])
if sys.argv[2] == "no-release":
    h.release_free_memory = lambda: False

class NetworkLike(MemoryColdStore):
    def get_bytes(self, key):  # a fresh body per read, as a MinIO response is
        return bytes(bytearray(super().get_bytes(key)))

store = NetworkLike()
rng = np.random.default_rng(0)
CLIENTS, ROUNDS = 8, 40
SIZES = (65792, 16384, 262144)  # floats: 257 KiB updates as the soak's, 64 KiB, 1 MiB
for r in range(ROUNDS):
    n = SIZES[r % len(SIZES)]
    ups = {f"c{i}": {"w": rng.normal(size=n).astype(np.float32)} for i in range(CLIENTS)}
    store.write_round("job", r, ups, None, {c: {"n_samples": 1} for c in ups}, {})
h.set_cold_store(store)

def call(path, ids):
    ev = SimpleNamespace(method="POST", path=path, body=json.dumps({"objects": ids}).encode(),
                         headers={}, query={})
    res = h.handle(ev, None)
    assert res["statusCode"] == 200, res

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

held = {t: [] for t in range(4)}

def worker(t, passes, out):
    for p in range(passes):
        for r in range(t, ROUNDS, 4):  # a round's updates in; the oldest of 3 held rounds out
            ids = [f"job/{r}/c{i}" for i in range(CLIENTS)]
            call("/load", ids)
            held[t].append(ids)
            json.dumps([{"k": i, "v": "x" * (i * 37 % 3000)} for i in range(200)])
            if len(held[t]) > 3:
                call("/evict", held[t].pop(0))
    out.append(rss_mib())

def churn(passes):
    out = []
    ts = [threading.Thread(target=worker, args=(t, passes, out)) for t in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return rss_mib()

base = rss_mib()
first = churn(2)
last = churn(20)
held_mib = h._used() / 2**20
print(json.dumps({"base_mib": base, "held_mib": held_mib, "after_warmup_mib": first, "end_mib": last}))
"""


def test_memory_follows_the_bytes_held_under_load_and_evict_churn(tmp_path: Path) -> None:
    """Four threads (the watchdog's) load 257 KiB, 64 KiB and 1 MiB updates and evict the
    oldest for 22 passes: what the process gained over its start stays within 1.25x of the
    bytes it holds. Without giving freed pages back (``no-release``; see core.memory) it
    kept about 2.2x on this machine (92 MiB for 42 MiB held)."""
    import os
    import subprocess
    import sys

    # the handler as this test's package has it: `flstore` in the repo (functions/ on the
    # path), `function` in the image the template builds (/home/app)
    package = __package__ or "flstore"
    root = Path(__file__).resolve().parents[len(package.split("."))]
    script = tmp_path / "churn.py"
    script.write_text(_CHURN)
    out = subprocess.run(
        [sys.executable, str(script), f"{package}.handler", "release"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["held_mib"] > 30, got
    assert got["end_mib"] - got["base_mib"] <= 1.25 * got["held_mib"], got


def test_a_handoff_maps_updates_in_place_and_gives_leases_back_on_evict_and_on_loss(
    store: MemoryColdStore,
) -> None:
    """Updates a gateway lends are mapped from its store (equal to the MinIO copies); an
    evicted one gives its lease back; a gateway gone takes the rest with it."""
    import os
    import time

    from cache_engine.keys import ObjectKey
    from core import wire
    from core.objstore import Namespace
    from core.objstore.handoff import HandoffServer

    cold = {c: store.get(ObjectKey.parse(f"job/1/{c}")) for c in ("a", "b", "c")}
    spec = wire.ModelSpec.build([("b", "F32", (3,)), ("w", "F32", (4, 3))])
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ns = Namespace(root, "n0", "job", spec.object_nbytes, pool=3)
    server = HandoffServer(root / "n0" / "handoff.sock")
    try:
        keys = {}
        for c, x in cold.items():
            obj = ns.allocate()
            wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=1, count=1, round=1)
            wire.flat_view(obj.buf, spec)[:] = 0
            wire.flat_view(obj.buf, spec)[: spec.numel] = x
            keys[c] = obj.key_bytes
            obj.close()
            ns.seal(keys[c])
        ticket = server.offer(ns, "job", 1, spec.numel, spec.hash.hex(), keys, 60)
        offer = [{"socket": str(server.path), "ticket": ticket, "node": "n0"}]
        ids = ["job/1/a", "job/1/b", "job/1/global"]
        code, body = _call("POST", "/load", {"objects": ids, "handoff": offer})
        assert code == 200, body
        assert sorted(body["mapped"]) == ["job/1/a", "job/1/b"]  # c was not asked for
        assert body["objects_mapped"] == 2
        for c in ("a", "b"):
            held = handler._objects[ObjectKey.parse(f"job/1/{c}")]
            np.testing.assert_array_equal(held, cold[c])
            assert not held.flags.writeable and not held.flags.owndata  # in place
            assert ns.leases(keys[c]) == 2  # the store's own + this function's
        assert ns.leases(keys["c"]) == 1  # claimed, not wanted: given back at once
        code, body = _call("POST", "/evict", {"objects": ["job/1/a"]})
        assert code == 200 and body["objects_mapped"] == 1
        assert ns.leases(keys["a"]) == 1
        code, body = _call("POST", "/load", {"objects": ["job/1/a"], "handoff": offer})
        assert code == 200 and body["mapped"] == []  # its lease went back: MinIO now
        code, body = _call(
            "POST", "/load", {"objects": ["job/1/a"], "handoff": [{"socket": 3, "ticket": 4}]}
        )
        assert code == 400 and body["error"] == "bad_request"
        server.close()  # the gateway goes: what it lent is dropped at once
        deadline = time.monotonic() + 5
        while ObjectKey.parse("job/1/b") in handler._objects and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ObjectKey.parse("job/1/b") not in handler._objects
        assert ObjectKey.parse("job/1/a") in handler._objects  # MinIO's copy stays
    finally:
        server.close()
        ns.close()
        for c in list(handler._handoffs.values()):
            c.close()
        handler._handoffs.clear()
        handler._lent.clear()


def _part_ids(c: str, parts: int) -> list[str]:
    return [f"job/1/{c}~{s}.{parts}" for s in range(parts)]


def test_parts_load_by_ranged_reads_and_answer_gram_and_combine() -> None:
    from cache_engine.keys import ObjectKey

    s = MemoryColdStore()
    rng = np.random.default_rng(2)
    ups = {
        c: {"w": rng.normal(size=(40,)).astype(np.float32), "b": rng.normal(size=(9,))}
        for c in "ab"
    }
    s.write_round("job", 1, ups, None, {c: {"n_samples": 1} for c in ups}, {})
    handler.set_cold_store(s)
    handler._objects.clear()
    try:
        whole = {c: s.get(ObjectKey.parse(f"job/1/{c}")) for c in "ab"}
        code, body = _call("POST", "/load", {"objects": _part_ids("a", 3) + _part_ids("b", 3)})
        assert code == 200, body
        for c in "ab":
            got = np.concatenate([handler._objects[ObjectKey.parse(i)] for i in _part_ids(c, 3)])
            np.testing.assert_array_equal(got, whole[c])  # float64 "b" read as float32 too
        assert _call("POST", "/load", {"objects": ["job/1/a~0.9"]})[0] == 400  # 49 floats: 3 parts
        rows = [[[1.0, "job/1/a"], [-1.0, "job/1/b"]], [[2.0, "job/1/b"]]]
        req = {
            "op": "gram",
            "bounds": [16, 32],
            "part": [1, 3],
            "objects": ["job/1/a", "job/1/b"],
            "rows": rows,
        }
        raw = handler.handle(
            SimpleNamespace(
                method="POST", path="/part", body=json.dumps(req).encode(), headers={}, query={}
            ),
            None,
        )
        assert raw["statusCode"] == 200, raw
        a64, b64 = (whole[c][16:32].astype(np.float64) for c in "ab")
        x = np.stack([a64 - b64, 2 * b64])
        np.testing.assert_allclose(np.frombuffer(raw["body"]).reshape(2, 2), x @ x.T, rtol=1e-12)
        req["op"] = "combine"
        raw = handler.handle(
            SimpleNamespace(
                method="POST", path="/part", body=json.dumps(req).encode(), headers={}, query={}
            ),
            None,
        )
        np.testing.assert_array_equal(
            np.frombuffer(raw["body"], np.float32).reshape(2, 16), x.astype(np.float32)
        )
        # a span within the bounds: only those coordinates, of what is held and of what is
        # read from the cold store alike
        for part in ([1, 3], None):
            code, body = _call("POST", "/evict", {"objects": ["job/1/b~1.3"]})
            assert code == 200, body
            narrow: dict[str, Any] = {
                **req,
                "span": [20, 27],
                "part": part,
                "source": {"credentials": {}, "chunk_bytes": 1 << 20},
            }
            raw = handler.handle(
                SimpleNamespace(
                    method="POST",
                    path="/part",
                    body=json.dumps(narrow).encode(),
                    headers={},
                    query={},
                ),
                None,
            )
            assert raw["statusCode"] == 200, raw
            np.testing.assert_array_equal(
                np.frombuffer(raw["body"], np.float32).reshape(2, 7), x[:, 4:11].astype(np.float32)
            )
    finally:
        handler.set_cold_store(None)
        handler._objects.clear()


def test_a_round_in_parts_is_reduced_here_from_this_and_another_functions_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cache_engine.keys import ObjectKey
    from cache_engine.queries import run_workload

    from .parts import Holdings, NotHeld, serve

    s = MemoryColdStore()
    rng = np.random.default_rng(1)
    g = rng.normal(size=(64,)).astype(np.float32)
    ups = {c: {"w": (g + rng.normal(0, 0.1, 64)).astype(np.float32)} for c in "abcde"}
    ups["e"] = {"w": (g - 3 * (ups["a"]["w"] - g)).astype(np.float32)}  # the odd one out
    s.write_round("job", 0, {}, {"w": g}, {}, {})
    s.write_round("job", 1, ups, {"w": g}, {c: {"n_samples": 10} for c in ups}, {})
    handler.set_cold_store(s)
    handler._objects.clear()
    try:
        mine = [f"job/1/{c}~0.2" for c in "abcde"] + ["job/0/global~0.2", "job/1/meta"]
        assert _call("POST", "/load", {"objects": mine})[0] == 200
        other = {  # the other function holds part 1 of every model
            ObjectKey.parse(i): v[32:]
            for i, v in ((f"job/1/{c}~1.2", s.get(ObjectKey.parse(f"job/1/{c}"))) for c in "abcde")
        }
        g_key = ObjectKey.parse("job/0/global~1.2")
        other[g_key] = s.get(ObjectKey.parse("job/0/global"))[32:]
        asked: list[str] = []

        def remote(function: str, endpoint: str | None, body: dict[str, Any]) -> bytes:
            """Another function's /part, as _remote_part gets it over HTTP."""
            asked.append(function)
            assert body["dim"] == 64  # the models' length: products chosen as over them
            try:
                return serve(body, Holdings(other.get, lambda job, grants: s))
            except NotHeld as exc:
                err = {"error": "not_held", "missing": exc.missing}
                raise handler.PartFailed(function, 409, err) from None

        monkeypatch.setattr(handler, "_remote_part", remote)
        models = [f"job/1/{c}" for c in "abcde"] + ["job/0/global"]
        slices = {
            "dim": 64,
            "ranges": [
                {"bounds": [0, 32], "part": [0, 2], "function": "flstore-cache"},
                {"bounds": [32, 64], "part": [1, 2], "function": "flstore-cache-9"},
            ],
        }
        objects = models + ["job/1/meta"]

        def reduce(name: str, sl: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            """The query's /run here, the reducer of the ranges ``sl`` names."""
            body = {"workload": name, "params": {"round": 1}, "objects": objects, "slices": sl}
            return _call("POST", "/run", body)

        for name in ("cosine-to-aggregate", "multi-krum"):
            code, body = reduce(name, slices)
            assert code == 200, body
            want = run_workload(
                name, {"round": 1}, {k: s.get(k) for k in map(ObjectKey.parse, objects)}
            )
            assert body["result"]["flagged"] == want["flagged"]
            score = "cosine" if name == "cosine-to-aggregate" else "scores"
            assert body["result"][score] == pytest.approx(want[score], rel=1e-9)
        assert set(asked) == {"flstore-cache-9"}  # its own part was computed here
        # the other function lost its part: the reducer says which function lacks what
        other.clear()
        code, body = reduce("multi-krum", slices)
        assert code == 409 and body["function"] == "flstore-cache-9"
        assert "job/1/a" in body["missing"]
        # past the budget, a part is read from the cold store: nothing kept
        before = dict(handler._objects)
        streamed = {"bounds": [0, 64], "part": None, "function": "flstore-cache"}
        code, body = reduce(
            "multi-krum", {**slices, "ranges": [streamed], "source": {"credentials": {}}}
        )
        assert code == 200, body
        assert body["result"]["scores"] == pytest.approx(want["scores"], rel=1e-9)
        assert handler._objects == before
        # part 0 held here, part 1 past the budget: the other function streams its range
        code, body = reduce("multi-krum", {**slices, "source": {"credentials": {}}})
        assert code == 200, body
        assert body["result"]["scores"] == pytest.approx(want["scores"], rel=1e-9)
    finally:
        handler.set_cold_store(None)
        handler._objects.clear()


def test_part_requests_that_make_no_sense_get_400() -> None:
    for bad in (
        {"op": "sum"},
        {"op": "gram", "bounds": [4, 2]},
        {"op": "gram", "bounds": [0, 2], "objects": ["job/1/a"], "rows": []},
        {"op": "gram", "bounds": [0, 2], "objects": ["job/1/a"], "rows": [[[1.0, "job/1/b"]]]},
        {
            "op": "gram",
            "bounds": [0, 2],
            "objects": ["job/1/a"],
            "rows": [[[float("nan"), "job/1/a"]]],
        },
        *(
            {
                "op": "combine",
                "bounds": [4, 8],
                "span": span,
                "objects": ["job/1/a"],
                "rows": [[[1.0, "job/1/a"]]],
            }
            for span in ([2, 6], [5, 9], [6, 6], [5], "all")
        ),
        *(
            {
                "op": "gram",
                "bounds": [0, 2],
                "objects": ["job/1/a"],
                "rows": [[[1.0, "job/1/a"]]],
                "source": {"credentials": {}, "chunk_bytes": chunk},
            }
            for chunk in (5, 2 << 30, "64 MiB", True)
        ),
    ):
        code, body = _call("POST", "/part", bad)
        assert code == 400 and body["error"] == "bad_request", (bad, body)
    code, body = _call(
        "POST",
        "/part",
        {"op": "gram", "bounds": [0, 2], "objects": ["job/1/a"], "rows": [[[1.0, "job/1/a"]]]},
    )
    assert code == 409 and body["missing"] == ["job/1/a"]


def test_parts_mapped_in_place_share_one_lease_given_back_with_the_last_part() -> None:
    import os

    from cache_engine.keys import ObjectKey
    from core import wire
    from core.objstore import Namespace
    from core.objstore.handoff import HandoffServer

    spec = wire.ModelSpec.build([("w", "F32", (40,))])
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ns = Namespace(root, "n0", "job", spec.object_nbytes, pool=2)
    server = HandoffServer(root / "n0" / "handoff.sock")
    handler._objects.clear()
    try:
        obj = ns.allocate()
        wire.write_header(obj.buf, spec, kind=wire.KIND_UPDATE, weight=1, count=1, round=1)
        x = np.arange(40, dtype=np.float32)
        wire.flat_view(obj.buf, spec)[:] = 0
        wire.flat_view(obj.buf, spec)[:40] = x
        key = obj.key_bytes
        obj.close()
        ns.seal(key)
        ticket = server.offer(ns, "job", 1, spec.numel, spec.hash.hex(), {"a": key}, 60)
        offer = [{"socket": str(server.path), "ticket": ticket, "node": "n0"}]
        code, body = _call("POST", "/load", {"objects": _part_ids("a", 2), "handoff": offer})
        assert code == 200 and sorted(body["mapped"]) == _part_ids("a", 2), body
        p0, p1 = (handler._objects[ObjectKey.parse(i)] for i in _part_ids("a", 2))
        np.testing.assert_array_equal(np.concatenate([p0, p1]), x)
        assert not p0.flags.owndata and not p0.flags.writeable  # views of the store's pages
        assert ns.leases(key) == 2 and body["mapped_bytes"] == 160  # one lease, 40 floats
        _call("POST", "/evict", {"objects": _part_ids("a", 2)[:1]})
        assert ns.leases(key) == 2  # part 1 still maps it
        _call("POST", "/evict", {"objects": _part_ids("a", 2)[1:]})
        assert ns.leases(key) == 1  # no part left here: the lease went back at once
    finally:
        server.close()
        ns.close()
        for c in list(handler._handoffs.values()):
            c.close()
        handler._handoffs.clear()
        handler._lent.clear()
        handler._objects.clear()

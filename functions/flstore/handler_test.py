"""Unit tests of the FLStore cache function's routes (in-memory cold store, no server)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cache_engine.cold_store import MemoryColdStore

_spec = importlib.util.spec_from_file_location(
    "flstore_cache_handler", Path(__file__).with_name("handler.py")
)
assert _spec and _spec.loader
handler = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(handler)


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


def test_run_executes_a_registered_workload_on_held_data(store: MemoryColdStore) -> None:
    wl = pytest.importorskip("fedfaas.workloads")
    if not hasattr(wl, "WORKLOADS"):
        pytest.skip("workload registry not written yet")
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

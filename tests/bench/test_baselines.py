"""The baselines' inner-product memo and the cache function's switch for its own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bench.baselines.server import ObjectGramMemo
from bench.baselines.settings import BaselineSettings
from bench.harness.synthetic import write_history
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import MemoryColdStore
from cache_engine.keys import ObjectKey
from cache_engine.queries import parse_query, plan
from flstore_workloads._linalg import gram

HANDLER = Path(__file__).resolve().parents[2] / "functions" / "flstore" / "handler.py"


def _fresh_copies(seed: int = 0) -> dict[ObjectKey, np.ndarray]:
    """What a baseline decodes on every query: new arrays with the same contents."""
    rng = np.random.default_rng(seed)
    out = {
        ObjectKey("j", 1, "update", c): rng.standard_normal(1000).astype(np.float32)
        for c in ("a", "b", "c")
    }
    out[ObjectKey("j", 0, "global")] = rng.standard_normal(1000).astype(np.float32)
    return out


def _rows(objs: dict[ObjectKey, np.ndarray]) -> list[list[tuple[float, np.ndarray]]]:
    g = objs[ObjectKey("j", 0, "global")]
    return [[(1.0, v), (-1.0, g)] for k, v in objs.items() if k.kind == "update"]


def test_the_memo_answers_a_later_query_on_fresh_copies_of_the_same_objects() -> None:
    memo = ObjectGramMemo()
    first = _fresh_copies()
    with memo.naming(first):
        g1 = gram(_rows(first), cache=memo)
    computed = memo.computed
    assert computed > 0 and memo.hits == 0
    second = _fresh_copies()  # same contents, other arrays
    assert all(a is not b for a, b in zip(first.values(), second.values(), strict=True))
    with memo.naming(second):
        g2 = gram(_rows(second), cache=memo)
    assert memo.computed == computed  # nothing recomputed
    assert memo.hits == 6  # the 3x3 upper triangle
    np.testing.assert_allclose(g2, g1)
    np.testing.assert_allclose(g1, gram(_rows(_fresh_copies())), rtol=1e-6)


def test_rows_over_vectors_no_object_names_are_computed_every_time() -> None:
    memo = ObjectGramMemo()
    objs = _fresh_copies()
    stranger = np.ones(1000, np.float32)
    rows = [[(1.0, stranger)], *_rows(objs)]
    for _ in range(2):
        with memo.naming(objs):
            gram(rows, cache=memo)
    assert memo.hits == 6  # only the pairs among the named rows
    # outside naming nothing is keyed
    assert memo.key([(1.0, next(iter(objs.values())))]) is None


def test_the_baseline_memo_flag_renders_and_parses() -> None:
    s = BaselineSettings(gram_memo=False)
    assert "--no-gram-memo" in s.to_argv()
    assert "--no-gram-memo" not in BaselineSettings().to_argv()
    parsed, _ = BaselineSettings.from_argv(["--no-gram-memo"])
    assert parsed.gram_memo is False


def _handler(monkeypatch: pytest.MonkeyPatch, memo: str | None) -> ModuleType:
    if memo is None:
        monkeypatch.delenv("FEDFAAS_FLSTORE_GRAM_MEMO", raising=False)
    else:
        monkeypatch.setenv("FEDFAAS_FLSTORE_GRAM_MEMO", memo)
    # a module of the handler's package: its siblings are imported relatively
    spec = importlib.util.spec_from_file_location(f"functions.flstore.handler_memo_{memo}", HANDLER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _call(mod: ModuleType, method: str, path: str, body: Any = None) -> dict[str, Any]:
    ev = SimpleNamespace(
        method=method,
        path=path,
        body=json.dumps(body).encode() if body is not None else b"",
        headers={},
        query={},
    )
    out = mod.handle(ev, SimpleNamespace(hostname="t"))
    assert out["statusCode"] == 200, out
    return dict(out["body"])


@pytest.mark.parametrize(("env", "on"), [(None, True), ("1", True), ("0", False)])
def test_the_cache_function_keeps_inner_products_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, env: str | None, on: bool
) -> None:
    cold = MemoryColdStore()
    write_history(cold, "j", 1, per_round=4, pool=6, seed=1)
    mod = _handler(monkeypatch, env)
    mod.set_cold_store(cold)
    cat = MemoryCatalog()
    for r in cold.rounds("j"):
        cat.add_round("j", r, list(cold.round_meta("j", r)["clients"]))
    body = {"workload": "cosine-to-aggregate", "job": "j", "rounds": [1], "params": {}}
    p = plan(parse_query(body), cat)  # what the engine asks of the function
    keys = [k.id for k in p.keys]
    _call(mod, "POST", "/load", {"objects": keys})
    query = {"workload": "cosine-to-aggregate", "params": p.params, "objects": keys}
    first = _call(mod, "POST", "/run", query)
    status = _call(mod, "GET", "/ping")
    assert status["gram_memo"] is on
    assert (status["gram_pairs"] > 0) is on
    assert _call(mod, "POST", "/run", query)["result"] == first["result"]


@pytest.mark.integration
def test_cache_agg_says_which_redis_reply_parser_it_reads_with(redis_url: Any) -> None:
    from redis._parsers import _RESP2Parser

    from bench.baselines.server import RedisSource

    fast = redis_url.client("admin")
    slow = redis_url.client("admin", parser_class=_RESP2Parser)
    try:
        # hiredis is in the bench extra; redis-py picks it when it is installed
        assert RedisSource(fast, None).parser() == "hiredis"  # type: ignore[arg-type]
        assert RedisSource(slow, None).parser() == "python"  # type: ignore[arg-type]
    finally:
        fast.close()
        slow.close()

"""The Gram kernel: float64 products on model-sized vectors, and the cross-query memo."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from flstore_workloads import GramCache, WorkloadData, get
from flstore_workloads._linalg import cosines, distances, gram

from .test_workloads_common import frozen, head_heavy_round

#: a model-sized length: from this length on, products were taken in float32 before issue 36
MODEL_SIZED = 1 << 20


def _realistic_round(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Weights ~0.05, updates ~1e-4 (|Delta| << |w|), honest clients close to each other."""
    rng = np.random.default_rng(seed)
    base = frozen((0.05 * rng.normal(size=d)).astype(np.float32))
    common = 1e-4 * rng.normal(size=d)
    ws = [
        frozen((base + common + 3e-5 * rng.normal(size=d)).astype(np.float32)) for _ in range(n - 1)
    ]
    ws.append(frozen((base - 2 * common).astype(np.float32)))  # a sign flipper
    return base, ws


def _reference(base: np.ndarray, ws: list[np.ndarray]) -> np.ndarray:
    u = np.stack([w.astype(np.float64) - base.astype(np.float64) for w in ws])
    return u @ u.T


def test_products_on_model_sized_updates_are_float64s() -> None:
    base, ws = _realistic_round(6, MODEL_SIZED + 4099)
    ref = _reference(base, ws)
    got = gram([[(1.0, w), (-1.0, base)] for w in ws])
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert np.abs(cosines(got) - cosines(ref)).max() <= 1e-12
    off = ~np.eye(len(ws), dtype=bool)  # Krum distances: cancellation between close honest clients
    rel = np.abs(distances(got) - distances(ref))[off] / distances(ref)[off]
    assert rel.max() <= 1e-9


def test_products_of_updates_whose_norm_sits_in_a_head_are_float64s() -> None:
    """Near-parallel updates with nearly all their norm in 650 coordinates, as in
    bench/flstore_rounds' round (a classifier head): float32 products put the cosines ~1e-6
    off here, as they did there (issue 36)."""
    g, ws = head_heavy_round(12, MODEL_SIZED + 650)
    ref = _reference(g, ws)
    got = gram([[(1.0, w), (-1.0, g)] for w in ws])
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert np.abs(cosines(got) - cosines(ref)).max() <= 1e-12


def test_the_parts_grams_of_model_sized_vectors_sum_to_the_whole_vectors() -> None:
    """A range of a long model (a part, a streamed chunk) is multiplied as the whole is: the
    ranges' Gram matrices sum to the whole vectors' (to float64 round-off)."""
    base, ws = _realistic_round(5, MODEL_SIZED + 6000)
    ref = _reference(base, ws)
    cuts = [0, 1000, 5008, 1 << 19, len(base)]
    parts = [
        gram([[(1.0, w[a:b]), (-1.0, base[a:b])] for w in ws])
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    np.testing.assert_allclose(sum(parts), ref, rtol=1e-12)


def test_weighted_rows_on_long_vectors_are_computed_in_float64() -> None:
    base, ws = _realistic_round(3, MODEL_SIZED + 7)
    rows = [[(0.3, ws[0]), (-0.3, base)], [(0.5, ws[1]), (0.25, ws[2]), (-0.75, base)]]
    w64, b64 = [w.astype(np.float64) for w in ws], base.astype(np.float64)
    u = [0.3 * (w64[0] - b64), 0.5 * w64[1] + 0.25 * w64[2] - 0.75 * b64]
    want = np.array([[a @ b for b in u] for a in u])
    np.testing.assert_allclose(gram(rows), want, rtol=1e-12)


def test_memo_answers_repeated_queries_without_recomputing_and_gives_the_same_result() -> None:
    rng = np.random.default_rng(1)
    base = frozen(rng.normal(size=3001).astype(np.float32))
    ws = [frozen((base + rng.normal(size=3001)).astype(np.float32)) for _ in range(5)]
    rows = [[(1.0, w), (-1.0, base)] for w in ws]
    cache = GramCache()
    first = gram(rows, cache=cache)
    computed = cache.computed
    again = gram(rows, cache=cache)
    assert cache.computed == computed and cache.hits > 0
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(first, gram(rows), rtol=1e-12)


def test_memo_computes_only_the_missing_cross_products_and_matches_a_fresh_gram() -> None:
    rng = np.random.default_rng(2)
    base = frozen(rng.normal(size=2000).astype(np.float32))
    a = [
        [(1.0, frozen((base + rng.normal(size=2000)).astype(np.float32))), (-1.0, base)]
        for _ in range(4)
    ]
    b = [
        [(1.0, frozen((base + rng.normal(size=2000)).astype(np.float32))), (-1.0, base)]
        for _ in range(3)
    ]
    cache = GramCache()
    gram(a, cache=cache)
    gram(b, cache=cache)
    before = cache.computed
    both = gram(a + b, cache=cache)
    assert cache.computed - before == len(a) * len(b)  # only the a x b block was new
    np.testing.assert_allclose(both, gram(a + b), rtol=1e-12, atol=1e-9)


def test_memo_ignores_writable_vectors_and_forgets_collected_ones() -> None:
    rng = np.random.default_rng(3)
    base = frozen(rng.normal(size=500).astype(np.float32))
    writable = rng.normal(size=500).astype(np.float32)
    cache = GramCache()
    gram([[(1.0, writable), (-1.0, base)]], cache=cache)
    assert len(cache) == 0  # a writable vector could change under the memo
    w = frozen(rng.normal(size=500).astype(np.float32))
    gram([[(1.0, w), (-1.0, base)]], cache=cache)
    assert len(cache) == 1
    del w
    gc.collect()
    assert len(cache) == 0  # an evicted object never answers for a new one


@pytest.mark.parametrize(
    "name,params",
    [
        ("cosine-to-aggregate", {"round": 2}),
        ("multi-krum", {"round": 2, "f": 1}),
        ("foolsgold", {"first_round": 1, "last_round": 2}),
        ("provenance", {"first_round": 1, "last_round": 2}),
    ],
)
def test_workloads_give_the_same_answer_with_and_without_the_memo(
    name: str, params: dict[str, int]
) -> None:
    rng = np.random.default_rng(4)
    d = 4000
    g0 = frozen(rng.normal(size=d).astype(np.float32))
    upd = {1: {f"c{i}": frozen((g0 + rng.normal(size=d)).astype(np.float32)) for i in range(5)}}
    meta = {1: {c: {"n_samples": 10 + i} for i, c in enumerate(upd[1])}}
    g1 = frozen(
        sum(0.2 * (w.astype(np.float64) - g0) for w in upd[1].values()).astype(np.float32) + g0
    )
    upd[2] = {f"c{i}": frozen((g1 + rng.normal(size=d)).astype(np.float32)) for i in range(2, 7)}
    meta[2] = {c: {"n_samples": 5 + i} for i, c in enumerate(upd[2])}
    g2 = frozen(g1 + rng.normal(size=d).astype(np.float32))
    cache = GramCache()
    warm = WorkloadData(
        updates=upd, globals={0: g0, 1: g1, 2: g2}, client_meta=meta, gram_cache=cache
    )
    for r in (1, 2):  # the per-round queries fill the memo first, as in a cache function
        get("cosine-to-aggregate").run(warm, {"round": r})
    plain = WorkloadData(updates=upd, globals={0: g0, 1: g1, 2: g2}, client_meta=meta)
    got, want = get(name).run(warm, params), get(name).run(plain, params)
    assert got.keys() == want.keys()
    for k, v in want.items():
        numeric = isinstance(v, float) or (
            isinstance(v, dict) and all(isinstance(x, float) for x in v.values())
        )
        if numeric:
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12)
        else:
            assert got[k] == v


def _tuple_cover(pairs: list[tuple[int, int]]) -> list[int]:
    """The greedy cover as it was written over Python tuples (the vectorised one must agree)."""
    left: list[int] = []
    rest = set(pairs)
    while rest:
        count: dict[int, int] = {}
        for a, b in rest:
            count[a] = count.get(a, 0) + 1
            if b != a:
                count[b] = count.get(b, 0) + 1
        best = max(sorted(count), key=lambda i: count[i])
        left.append(best)
        rest = {p for p in rest if best not in p}
    return sorted(left)


@pytest.mark.parametrize("seed", range(6))
def test_the_greedy_cover_on_a_boolean_matrix_picks_the_rows_the_tuple_greedy_picked(
    seed: int,
) -> None:
    from flstore_workloads._linalg import _cover

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    upper = np.triu(rng.random((n, n)) < rng.uniform(0.05, 0.9))
    if seed == 0:
        upper[:] = False
        upper[3:5, :] = np.triu(np.ones((n, n), dtype=bool))[3:5, :]  # two rows' new products
    missing = upper | upper.T
    pairs = [(a, b) for a in range(n) for b in range(a, n) if upper[a, b]]
    left = _cover(missing)
    assert left == _tuple_cover(pairs)
    assert all(a in left or b in left for a, b in pairs)


def test_a_gram_with_nothing_known_takes_every_row_without_a_cover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A streamed ``/part`` computes a chunk's Gram matrix with no memo, chunk after chunk: a
    cover there is all rows, and searching it cost 0.2-0.4 s a chunk at 200 rows (issue 36's
    Gram queries). With the memo's entries for some rows, the cover still decides."""
    import flstore_workloads._linalg as linalg

    base, ws = _realistic_round(12, 4096)
    rows = [[(1.0, w), (-1.0, base)] for w in ws]
    real_cover = linalg._cover
    calls: list[int] = []

    def counted(missing: np.ndarray) -> list[int]:
        calls.append(int(missing.sum()))
        return real_cover(missing)

    monkeypatch.setattr(linalg, "_cover", counted)
    got = gram(rows)
    assert calls == []
    np.testing.assert_allclose(got, _reference(base, ws), rtol=1e-12)

    cache = GramCache()
    gram(rows[:8], cache=cache)
    assert calls == []
    again = gram(rows, cache=cache)  # rows 8..11 new: only their products are missing
    assert len(calls) == 1 and calls[0] == 12 * 12 - 8 * 8
    np.testing.assert_allclose(again, _reference(base, ws), rtol=1e-12)

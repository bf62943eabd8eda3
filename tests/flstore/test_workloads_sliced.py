"""Workloads over vectors held in coordinate parts give the answers of the whole vectors.

The reference is the obvious one: the same workload on the whole vectors in one process
(numpy over the whole matrix). The parts are held here (:class:`LocalParts`), so this is the
pure math of :mod:`flstore_workloads.sliced`; the cache functions run the same code over HTTP
(``tests/flstore/test_sliced_queries.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from flstore_workloads import WorkloadData, get
from flstore_workloads.sliced import (
    LocalParts,
    SlicedData,
    VectorRef,
    max_parts,
    part_bounds,
)

from .test_workloads_common import Federation, attacked_round, evaluator, sybil_run, three_rounds


def sliced(fed: Federation, parts: int, with_evaluator: bool = False) -> SlicedData:
    """``fed``'s data with every vector held in ``parts`` parts, as a reducer sees it."""
    vectors: dict[str, np.ndarray] = {}
    updates: dict[int, dict[str, Any]] = {}
    globals_: dict[int, Any] = {}
    for r, ups in fed.updates.items():
        for c, w in ups.items():
            vectors[f"{r}/{c}"] = w
            updates.setdefault(r, {})[c] = VectorRef(f"{r}/{c}", w.shape[0])
    for v, g in fed.globals.items():
        vectors[f"{v}/global"] = g
        globals_[v] = VectorRef(f"{v}/global", g.shape[0])
    return SlicedData(
        updates=updates,
        globals=globals_,
        client_meta=fed.client_meta,
        evaluator=evaluator() if with_evaluator else None,
        parts=LocalParts.cut(vectors, parts),
    )


def test_part_bounds_cover_the_vector_in_aligned_near_equal_ranges() -> None:
    for d, parts in ((650, 1), (650, 3), (650, 40), (11_181_642, 8), (16, 1)):
        b = part_bounds(d, parts)
        assert b[0][0] == 0 and b[-1][1] == d and len(b) == parts
        assert all(x[1] == y[0] for x, y in zip(b, b[1:], strict=False))
        assert all(a % 16 == 0 for a, _ in b)
        sizes = [hi - lo for lo, hi in b]
        assert min(sizes) > 0 and max(sizes) - min(sizes) <= 32
    with pytest.raises(ValueError, match="1..40"):
        part_bounds(650, max_parts(650) + 1)


@pytest.mark.parametrize("parts", [2, 5])
def test_gram_workloads_over_parts_equal_the_whole_vectors(parts: int) -> None:
    fed = attacked_round()
    whole, cut = fed.workload_data(), sliced(fed, parts)
    for name, params in (
        ("cosine-to-aggregate", {"round": 1, "bottom_k": 2}),
        ("multi-krum", {"round": 1, "f": 2}),
        ("kmeans", {"round": 1, "k": 2, "n_init": 2}),
    ):
        a, b = get(name).run(whole, params), get(name).run(cut, params)
        assert a.keys() == b.keys()
        for key in ("flagged", "selected", "ranking", "krum", "labels"):
            if key in a:
                assert a[key] == b[key], (name, key)
        for key in ("cosine", "scores"):
            for c, x in a.get(key, {}).items():
                assert b[key][c] == pytest.approx(x, rel=1e-9, abs=1e-9), (name, key, c)


def test_foolsgold_and_provenance_across_rounds_over_parts() -> None:
    fed = sybil_run()
    fg = {"first_round": 1, "last_round": 3}
    a, b = get("foolsgold").run(fed.workload_data(), fg), get("foolsgold").run(sliced(fed, 3), fg)
    assert a["flagged"] == b["flagged"]
    for c, w in a["weights"].items():
        assert b["weights"][c] == pytest.approx(w, abs=1e-9)
    fed = three_rounds()
    pv = {"first_round": 1, "last_round": 3, "lineage": True}
    a = get("provenance").run(fed.workload_data(), pv)
    b = get("provenance").run(sliced(fed, 4), pv)
    for c, s in a["shares"].items():
        assert b["shares"][c] == pytest.approx(s, rel=1e-9)
    assert a["lineage"] == b["lineage"]  # digests of the vectors assembled from their parts


def test_contribution_workloads_over_parts_evaluate_the_same_sub_models() -> None:
    fed = attacked_round()
    whole, cut = fed.workload_data(True), sliced(fed, 3, True)
    for name, params in (
        ("leave-one-out", {"round": 1}),
        ("shapley", {"round": 1, "seed": 3, "max_permutations": 40}),
        ("personalize", {"round": 1, "client": "c02", "alpha": None}),
        ("evaluate", {"round": 1, "client": "c05"}),
    ):
        a, b = get(name).run(whole, params), get(name).run(cut, params)
        assert _flat(a) == pytest.approx(_flat(b), abs=1e-9), name


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested answers as one level (pytest.approx compares flat mappings)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_a_row_with_a_local_vector_adds_it_at_the_reducer() -> None:
    fed = attacked_round()
    cut = sliced(fed, 4)
    g, w = fed.globals[0], fed.updates[1]["c01"]
    local = np.linspace(-1, 1, g.shape[0])
    got = cut.combine_many(
        [
            [(1.0, cut.globals[0]), (0.5, local)],
            [(0.25, local)],
            [(1.0, cut.updates[1]["c01"]), (-1.0, cut.globals[0])],
        ]
    )
    np.testing.assert_allclose(got[0], g.astype(np.float64) + 0.5 * local, rtol=1e-6)
    np.testing.assert_allclose(got[1], 0.25 * local, rtol=1e-6)
    np.testing.assert_array_equal(got[2], (w.astype(np.float64) - g).astype(np.float32))


def test_whole_data_combine_hands_back_a_stored_vector_itself() -> None:
    g = three_rounds().globals[1]
    (same,) = WorkloadData().combine_many([[(1.0, g)]])
    assert same is g or np.shares_memory(same, g)


class _Reads:
    """Scores coordinates ``[a, b)`` of a model with ``inner``; ``told``: says so (``span``)
    and then must be given exactly those coordinates."""

    def __init__(self, inner: Any, a: int, b: int, told: bool) -> None:
        self.inner, self.a, self.b = inner, a, b
        self.lengths: set[int] = set()
        if told:
            self.span = (a, b)

    def __call__(self, x: np.ndarray) -> float:
        self.lengths.add(int(x.shape[0]))
        cut = x if hasattr(self, "span") else x[self.a : self.b]
        assert cut.shape[0] == self.b - self.a
        return float(self.inner(cut))


def _padded(fed: Federation, before: int, after: int) -> Federation:
    """``fed`` with every vector between ``before`` and ``after`` random floats (its model
    at coordinates ``[before, before + 650)`` of a longer vector)."""
    rng = np.random.default_rng(5)
    pre, post = rng.normal(size=before), rng.normal(size=after)

    def pad(x: np.ndarray) -> np.ndarray:
        y = np.concatenate([pre + rng.normal(size=before) * 0.1, x, post]).astype(np.float32)
        y.setflags(write=False)
        return y

    return dataclasses.replace(
        fed,
        updates={r: {c: pad(w) for c, w in u.items()} for r, u in fed.updates.items()},
        globals={v: pad(g) for v, g in fed.globals.items()},
    )


def test_an_evaluator_of_a_range_gets_only_that_range_of_each_sub_model_same_values() -> None:
    fed = _padded(attacked_round(), 1000, 3000)
    a, b = 1000, 1650
    for name, params in (
        ("leave-one-out", {"round": 1}),
        ("shapley", {"round": 1, "seed": 3, "max_permutations": 40}),
    ):
        whole = fed.workload_data(False)
        whole.evaluator = want_ev = _Reads(evaluator(), a, b, told=False)
        want = get(name).run(whole, params)
        assert want_ev.lengths == {4650}  # the whole sub-models, as before
        for data in (fed.workload_data(False), sliced(fed, 5)):
            ev = _Reads(evaluator(), a, b, told=True)
            data.evaluator = ev
            got = get(name).run(data, params)
            assert ev.lengths == {b - a}, name  # the evaluator's range alone
            assert _flat(got) == pytest.approx(_flat(want), abs=1e-9), name

"""core.secagg.fold.MaskedAccumulator: the eager leaf/middle/top fold of masked vectors with
FedAvg's accumulator interface; any order and any tree give the same Z_2^32 sum."""

from __future__ import annotations

import numpy as np
import pytest

from core.secagg.fold import MaskedAccumulator

N = 1001


def _vectors(k: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, N, dtype=np.uint32) for _ in range(k)]


def _sum(vs: list[np.ndarray]) -> np.ndarray:
    total: np.ndarray = np.sum(np.stack(vs).astype(np.uint64), axis=0) % 2**32
    return total.astype(np.uint32)


def test_leaves_middles_and_top_give_the_exact_wrapped_sum() -> None:
    vs = _vectors(7)
    leaves = []
    for chunk in (vs[:3], vs[3:5], vs[5:]):
        leaf = MaskedAccumulator(np.full(N, 12345, np.uint32))  # garbage: the first fold writes
        for v in chunk:
            leaf.add(v, 1.0)
        leaves.append(leaf)
    top = MaskedAccumulator(np.empty(N, np.uint32))
    for i, leaf in enumerate(leaves):
        top.merge(leaf.acc, leaf.weight, leaf.count, final=i == len(leaves) - 1)
    assert top.final and top.count == 7 and top.weight == 7.0
    np.testing.assert_array_equal(top.finalize(), _sum(vs))
    with pytest.raises(ValueError, match="final sum"):
        top.add(vs[0], 1.0)


def test_merge_into_reads_a_sealed_accumulator_and_writes_another() -> None:
    vs = _vectors(3, seed=1)
    sealed = np.empty(N, np.uint32)
    acc = MaskedAccumulator(sealed)
    acc.add(vs[0], 2.0)
    acc.add(vs[1], 3.0)
    sealed.flags.writeable = False  # a sealed checkpoint: only read from now on
    spare = np.empty(N, np.uint32)
    nxt = acc.merge_into(spare, vs[2], 4.0, 1, final=True)
    assert nxt.acc is spare and nxt.final and (nxt.weight, nxt.count) == (9.0, 3)
    np.testing.assert_array_equal(spare, _sum(vs))
    out = np.empty(N, np.uint32)
    np.testing.assert_array_equal(nxt.finalize(out), _sum(vs))


def test_float_vectors_and_empty_sums_are_refused() -> None:
    with pytest.raises(TypeError, match="must be uint32"):
        MaskedAccumulator(np.zeros(N, np.float32))
    acc = MaskedAccumulator(np.zeros(N, np.uint32))
    with pytest.raises(TypeError, match="a masked input must be uint32"):
        acc.add(np.zeros(N, np.float32), 1.0)
    with pytest.raises(ValueError, match="weight must be positive"):
        acc.add(np.zeros(N, np.uint32), 0)
    with pytest.raises(ValueError, match="nothing was folded"):
        acc.finalize()

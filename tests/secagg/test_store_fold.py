"""Masked vectors in the shared-memory object store (core.objstore), folded eagerly by a
leaf/middle/top tree of core.secagg.fold's accumulators (uint32 addition): any tree gives the
exact sum, and no stored object, update or partial, is distinguishable from uniform bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.objstore import MappedObject, Namespace
from core.secagg.config import SecAggConfig
from core.secagg.fold import MaskedAccumulator
from tests.secagg.rounds import UNIFORM_P, D, looks_uniform, run_round

NBYTES = 4 * (D + 1)


class StoreTree:
    """Each masked vector written once into a store object and sealed; leaves of ``per_leaf``
    updates fold them into a partial object as they come, middles fold leaves, the top folds
    middles. Every object stays in the store for the checks."""

    def __init__(self, root: Path, per_leaf: int, leaves_per_middle: int) -> None:
        self.ns = Namespace(root, "node-a", "job-a", NBYTES, pool=4)
        self.per_leaf, self.per_middle = per_leaf, leaves_per_middle
        self.keys: list[bytes] = []

    def _vec(self, obj: MappedObject) -> np.ndarray:
        return obj.ndarray(np.uint32, 0, D + 1)

    def _store(self, vec: np.ndarray) -> bytes:
        obj = self.ns.allocate()
        self._vec(obj)[:] = vec
        key = obj.key_bytes
        obj.close()
        self.ns.seal(key)
        self.keys.append(key)
        return key

    def _fold(self, keys: list[bytes], *, partials: bool) -> bytes:
        acc = self.ns.allocate()
        folder = MaskedAccumulator(self._vec(acc))
        for k in keys:  # eager: one input at a time, in place
            with self.ns.open(k) as obj:
                if partials:
                    folder.merge(self._vec(obj), 1.0, 1)
                else:
                    folder.add(self._vec(obj), 1.0)
        del folder
        key = acc.key_bytes
        acc.close()
        self.ns.seal(key)
        self.keys.append(key)
        return key

    def __call__(self, vectors: list[np.ndarray]) -> np.ndarray:
        updates = [self._store(v) for v in vectors]
        leaves = [
            self._fold(updates[i : i + self.per_leaf], partials=False)
            for i in range(0, len(updates), self.per_leaf)
        ]
        middles = [
            self._fold(leaves[i : i + self.per_middle], partials=True)
            for i in range(0, len(leaves), self.per_middle)
        ]
        top = self._fold(middles, partials=True)
        with self.ns.open(top) as obj:
            return self._vec(obj).copy()


@pytest.mark.parametrize(("per_leaf", "per_middle"), [(2, 2), (3, 1), (10, 1)])
def test_any_tree_of_store_objects_unmasks_to_the_exact_sum(
    tmp_path: Path, per_leaf: int, per_middle: int
) -> None:
    tree = StoreTree(tmp_path / "shm", per_leaf, per_middle)
    try:
        out = run_round(SecAggConfig(neighbours=6), 10, fold=tree)
        np.testing.assert_array_equal(out.got, out.want)
        for key in tree.keys:  # every update and partial, the top's sum too (self masks)
            with tree.ns.open(key) as obj:
                assert looks_uniform(bytes(obj.buf[:NBYTES])) > UNIFORM_P
    finally:
        tree.ns.close()


def test_two_of_ten_dropped_after_masking_with_the_store_fold_is_exact(tmp_path: Path) -> None:
    tree = StoreTree(tmp_path / "shm", 2, 2)
    try:
        out = run_round(SecAggConfig(), 10, drop_after_masking={0, 9}, fold=tree)
        assert len(out.survivors) == 8
        np.testing.assert_array_equal(out.got, out.want)
    finally:
        tree.ns.close()

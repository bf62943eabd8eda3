"""Eager hierarchical FedAvg equals flat FedAvg over any tree (np.average and Flower's formula).

``flwr`` is not installed in this environment (it is an optional ``bench`` extra), so Flower's
``aggregate`` is checked through ``fedavg.flower_aggregate``, a line-for-line copy of its formula
(reference/workloads.md: multiply by n_i, ``reduce(np.add)``, divide by the total). When flwr is
importable, the test also calls the real one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from core import fedavg

TOL = 1e-6


def make_updates(rng: np.random.Generator, k: int, n: int) -> tuple[list[np.ndarray], list[int]]:
    ups = [rng.standard_normal(n).astype(np.float32) * rng.uniform(0.1, 10) for _ in range(k)]
    weights = [int(w) for w in rng.integers(1, 5000, size=k)]
    return ups, weights


def random_tree(rnd: random.Random, leaves: list[int]) -> object:
    """A random tree over leaf indices: nested lists, any fan-out, any depth."""
    if len(leaves) == 1 or rnd.random() < 0.2:
        return leaves
    rnd.shuffle(leaves)
    cuts = sorted(rnd.sample(range(1, len(leaves)), k=min(len(leaves) - 1, rnd.randint(1, 4))))
    parts = [leaves[a:b] for a, b in zip([0, *cuts], [*cuts, len(leaves)], strict=True)]
    return [random_tree(rnd, p) for p in parts]


def eager_tree(
    tree: object, ups: list[np.ndarray], ws: list[int], lazy: bool, kernel: str = "torch"
) -> fedavg.Accumulator:
    """Aggregate like the aggregator functions do: leaves fold updates, parents merge sums."""
    acc = (
        torch.empty(ups[0].shape, dtype=torch.float32)
        if kernel == "torch"
        else np.empty(ups[0].shape, np.float32)
    )
    node: fedavg.Accumulator | fedavg.LazyAccumulator
    node = fedavg.LazyAccumulator(acc) if lazy else fedavg.Accumulator(acc)
    assert isinstance(tree, list)
    for child in tree:
        if isinstance(child, int):
            node.add(ups[child], ws[child])
        else:
            sub = eager_tree(child, ups, ws, lazy, kernel)
            node.merge(sub.acc, sub.weight, sub.count)
    return node.fold() if isinstance(node, fedavg.LazyAccumulator) else node


@pytest.mark.parametrize("kernel", ["torch", "numpy"])
@pytest.mark.parametrize("lazy", [False, True])
def test_any_random_tree_equals_flat_fedavg_and_flowers_formula(lazy: bool, kernel: str) -> None:
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    for _ in range(25):
        k = rnd.randint(1, 25)
        ups, ws = make_updates(rng, k, rnd.randint(1, 40000))  # crosses numpy's block size
        top = eager_tree(random_tree(rnd, list(range(k))), ups, ws, lazy, kernel)
        assert top.count == k and top.weight == sum(ws)
        got = np.asarray(top.finalize())
        assert fedavg.rel_error(got, fedavg.fedavg_reference(ups, ws)) <= TOL
        flower = fedavg.flower_aggregate([([u], w) for u, w in zip(ups, ws, strict=True)])[0]
        assert fedavg.rel_error(got, flower) <= TOL


def test_real_flower_aggregate_when_installed() -> None:
    agg = pytest.importorskip(
        "flwr.server.strategy.aggregate", reason="flwr not installed (bench extra)"
    )
    rng = np.random.default_rng(1)
    ups, ws = make_updates(rng, 7, 500)
    ours = fedavg.flower_aggregate([([u], w) for u, w in zip(ups, ws, strict=True)])[0]
    theirs = agg.aggregate([([u], w) for u, w in zip(ups, ws, strict=True)])[0]
    np.testing.assert_array_equal(ours, theirs)


def test_two_equal_clients_get_equal_weight_unlike_running_rate_fedavg() -> None:
    a, b = np.full(4, 1.0, np.float32), np.full(4, 3.0, np.float32)
    acc = fedavg.Accumulator(torch.empty(4))
    acc.add(a, 10)
    acc.add(b, 10)
    np.testing.assert_array_equal(acc.finalize().numpy(), np.full(4, 2.0))


def test_first_fold_overwrites_garbage_so_accumulators_need_no_zeroing() -> None:
    buf = torch.full((8,), float("nan"))
    acc = fedavg.Accumulator(buf)
    acc.add(np.ones(8, np.float32), 2)
    assert torch.equal(buf, torch.full((8,), 2.0))


def test_accumulate_works_in_place_on_numpy_views_of_shared_buffers() -> None:
    raw = bytearray(64)
    acc = np.frombuffer(raw, np.float32)
    upd = np.frombuffer(bytes(np.arange(16, dtype=np.float32).tobytes()), np.float32)  # read-only
    fedavg.accumulate(acc, upd, 2.0, first=True)
    fedavg.accumulate(acc, upd, 1.0)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), np.arange(16) * 3.0)
    fedavg.finalize(acc, 3.0)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), np.arange(16))


def test_non_positive_weights_are_refused() -> None:
    acc = fedavg.Accumulator(torch.empty(2))
    with pytest.raises(ValueError):
        acc.add(np.ones(2, np.float32), 0)
    with pytest.raises(ValueError):
        fedavg.finalize(torch.ones(2), 0.0)


def test_numpy_and_torch_kernels_agree() -> None:
    rng = np.random.default_rng(5)
    ups, ws = make_updates(rng, 6, 100_003)
    a_np, a_t = (
        fedavg.Accumulator(np.empty(100_003, np.float32)),
        fedavg.Accumulator(torch.empty(100_003)),
    )
    for u, w in zip(ups, ws, strict=True):
        a_np.add(u, w)
        a_t.add(u, w)
    assert fedavg.rel_error(a_np.finalize(), a_t.finalize().numpy()) <= 1e-6


def test_blocked_numpy_kernel_matches_the_blas_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    ups, ws = make_updates(rng, 5, 70_001)
    blas = fedavg.Accumulator(np.empty(70_001, np.float32))
    for u, w in zip(ups, ws, strict=True):
        blas.add(u, w)
    monkeypatch.setattr(fedavg, "_SAXPY", [None])
    blocked = fedavg.Accumulator(np.empty(70_001, np.float32))
    for u, w in zip(ups, ws, strict=True):
        blocked.add(u, w)
    assert fedavg.rel_error(blas.finalize(), np.asarray(blocked.finalize())) <= 1e-6


def test_merge_into_writes_the_sum_elsewhere_in_one_pass_and_only_reads_its_inputs() -> None:
    rng = np.random.default_rng(3)
    base, part = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    acc = fedavg.Accumulator(base.copy(), 4.0, 2, _empty=False)
    base_ro, part_ro = base.copy(), part.copy()
    base_ro.flags.writeable = part_ro.flags.writeable = False  # sealed objects are read-only
    acc.acc = base_ro
    out = np.empty_like(base)
    merged = acc.merge_into(out, part_ro, 3.0, 1)
    assert merged.acc is out and (merged.weight, merged.count) == (7.0, 3)
    np.testing.assert_array_equal(out, base + part)
    empty = fedavg.Accumulator(np.zeros_like(base))  # nothing folded yet: the partial itself
    np.testing.assert_array_equal(empty.merge_into(out, part_ro, 3.0, 1).acc, part)


def test_preload_imports_the_blas_kernel_before_any_fold() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from core import fedavg; "
        "assert 'scipy.linalg.blas' not in sys.modules; fedavg.preload(); "
        "assert 'scipy.linalg.blas' in sys.modules and fedavg._SAXPY[0] is not None"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_top_on_several_threads_with_a_fused_last_fold_equals_flat_fedavg(threads: int) -> None:
    rng = np.random.default_rng(11)
    n = 3 * fedavg.MIN_SPLIT + 5  # enough coordinates to be cut into ranges
    ups, ws = make_updates(rng, 6, n)
    want = fedavg.fedavg_reference(ups, ws)
    # two children's partial sums, as leaves send them
    parts = []
    for lo, hi in ((0, 3), (3, 6)):
        leaf = fedavg.Accumulator(np.empty(n, np.float32))
        for u, w in zip(ups[lo:hi], ws[lo:hi], strict=True):
            leaf.add(u, w)
        parts.append(leaf)
    # in place: merge, then a final merge that divides in the same pass
    top = fedavg.Accumulator(np.empty(n, np.float32), threads=threads)
    top.merge(parts[0].acc, parts[0].weight, parts[0].count)
    top.merge(parts[1].acc, parts[1].weight, parts[1].count, final=True)
    assert top.final and top.count == 6 and top.weight == sum(ws)
    assert fedavg.rel_error(top.finalize(), want) < TOL  # finalize divides no second time
    # into a spare (the sealed checkpoint is only read)
    ckpt = fedavg.Accumulator(parts[0].acc.copy(), parts[0].weight, parts[0].count, _empty=False)
    ckpt.acc.setflags(write=False)
    spare = np.full(n, np.nan, np.float32)
    done = ckpt.merge_into(spare, parts[1].acc, parts[1].weight, parts[1].count, final=True)
    assert done.final and done.acc is spare
    assert fedavg.rel_error(spare, want) < TOL
    with pytest.raises(ValueError, match="final"):
        done.merge(parts[1].acc, 1.0, 1)


def test_kernels_split_into_coordinate_ranges_give_the_one_thread_result() -> None:
    rng = np.random.default_rng(5)
    n = 4 * fedavg.MIN_SPLIT + 17
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    for threads in (2, 4):
        one, many = a.copy(), a.copy()
        fedavg.accumulate(one, b, 0.25)
        fedavg.accumulate(many, b, 0.25, threads=threads)
        assert np.array_equal(one, many)
        out1, outk = np.empty_like(a), np.empty_like(a)
        fedavg.add_into(out1, a, b, divide_by=3.0)
        fedavg.add_into(outk, a, b, divide_by=3.0, threads=threads)
        assert np.array_equal(out1, outk)
        np.testing.assert_allclose(out1, (a + b) / np.float32(3.0), rtol=1e-6)

"""Placement against brute force on small cases (pure; no timing asserts)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import control_plane.placement as placement_mod
from control_plane.errors import InvalidInput
from control_plane.placement import POLICIES, place, residual_capacity


def reference(sizes, residual, policy, queue=None, overflow="spill"):
    """Slow obvious item-by-item placement, written independently of the module."""
    r = list(map(float, residual))
    q = [0.0] * len(r) if queue is None else list(map(float, queue))
    out, over = [], []
    for t, s in enumerate(sizes):
        feas = [i for i in range(len(r)) if r[i] >= s - 1e-9]
        if policy == "leastconn":
            i = min(range(len(r)), key=lambda j: (q[j], j))
            if i not in feas:
                over.append(t)
        elif feas:
            if policy == "bestfit":
                i = min(feas, key=lambda j: (r[j], j))
            elif policy == "worstfit":
                i = min(feas, key=lambda j: (-r[j], j))
            else:
                i = feas[0]
        elif overflow == "reject":
            out.append(-1)
            continue
        else:
            i = min(range(len(r)), key=lambda j: (-r[j], j))
            over.append(t)
        r[i] -= s
        q[i] += s
        out.append(i)
    return out, r, over


def random_case(rng, n_items, n_nodes, equal):
    if equal:
        sizes = np.full(n_items, float(rng.integers(1, 4)))
    else:
        sizes = rng.integers(1, 6, size=n_items).astype(float)
    residual = rng.integers(0, 25, size=n_nodes).astype(float)
    queue = rng.integers(0, 10, size=n_nodes).astype(float)
    return sizes, residual, queue


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("overflow", ["spill", "reject"])
@pytest.mark.parametrize("path", ["vectorised", "scan", "sorted"])
def test_every_policy_matches_item_by_item_reference(policy, overflow, path, monkeypatch):
    monkeypatch.setattr(placement_mod, "_SHORT_RUN", 0 if path == "vectorised" else 10**9)
    monkeypatch.setattr(placement_mod, "_SORTED_NODES", 0 if path == "sorted" else 10**9)
    rng = np.random.default_rng(7)
    for trial in range(80):
        sizes, residual, queue = random_case(
            rng, int(rng.integers(0, 60)), int(rng.integers(1, 7)), equal=trial % 2 == 0
        )
        got = place(sizes, residual, policy, queue=queue, overflow=overflow)
        want, r_after, over = reference(sizes, residual, policy, queue, overflow)
        assert got.assignment.tolist() == want, (trial, sizes, residual)
        np.testing.assert_allclose(got.residual, r_after)
        assert got.overflowed.tolist() == over
        assert got.unplaced.tolist() == [t for t, i in enumerate(want) if i == -1]


def test_bestfit_picks_the_feasible_node_with_least_residual_capacity():
    rng = np.random.default_rng(1)
    for _ in range(200):
        residual = rng.integers(0, 10, size=6).astype(float)
        size = float(rng.integers(1, 5))
        got = place([size], residual).assignment[0]
        feasible = [i for i in range(6) if residual[i] >= size]
        if feasible:
            assert got == min(feasible, key=lambda i: (residual[i], i))
        else:  # spill: the node with most room left, lowest index on ties
            assert got == min(range(6), key=lambda i: (-residual[i], i))


def test_ties_go_to_the_lowest_node_index():
    assert place([1.0], [5.0, 5.0, 5.0], "bestfit").assignment.tolist() == [0]
    assert place([1.0], [5.0, 5.0, 5.0], "worstfit").assignment.tolist() == [0]
    assert place([1.0, 1.0, 1.0], [5.0, 5.0, 5.0], "leastconn").assignment.tolist() == [0, 1, 2]


def optimal_bins(sizes, cap):
    """Fewest bins of capacity cap holding all items (brute force, tiny instances)."""
    n = len(sizes)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            load = [0.0] * k
            for s, b in zip(sizes, assign, strict=True):
                load[b] += s
            if max(load) <= cap + 1e-9:
                return k
    return n


@pytest.mark.parametrize(
    "policy,order",
    [
        ("bestfit", "arrival"),
        ("firstfit", "arrival"),
        ("bestfit", "decreasing"),
        ("firstfit", "decreasing"),
    ],
)
def test_nodes_used_stays_within_the_known_bin_packing_bound(policy, order):
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(1, 7))
        cap = 10.0
        sizes = rng.integers(1, 11, size=n).astype(float)
        opt = optimal_bins(sizes.tolist(), cap)
        got = place(sizes, np.full(n, cap), policy, order=order, overflow="reject")
        assert got.unplaced.size == 0
        assert opt <= got.nodes_used() <= 1.7 * opt + 1


def test_bestfit_packs_onto_fewer_nodes_than_leastconn_as_in_fig8():
    residual = np.full(5, 20.0)
    for n, want_nodes in ((20, 1), (60, 3), (100, 5)):
        assert place(np.ones(n), residual, "bestfit").nodes_used() == want_nodes
        assert place(np.ones(n), residual, "leastconn").nodes_used() == 5


def test_overflow_spills_to_the_node_with_most_room_and_is_reported():
    got = place(np.ones(7), [2.0, 3.0], "bestfit")
    assert got.counts().tolist() == [3, 4]
    assert got.overflowed.tolist() == [5, 6]
    np.testing.assert_allclose(got.residual, [-1.0, -1.0])


def test_overflow_reject_leaves_items_unplaced():
    got = place(np.ones(7), [2.0, 3.0], "firstfit", overflow="reject")
    assert got.unplaced.tolist() == [5, 6]
    assert (got.assignment[:5] >= 0).all()


def test_decreasing_order_keeps_assignment_in_input_order():
    got = place([1.0, 5.0, 2.0], [5.0, 3.0], "bestfit", order="decreasing")
    # 5 -> node0 (only fit), 2 -> node1 (bestfit 3), 1 -> node1 (1 left)
    assert got.assignment.tolist() == [1, 0, 1]


def test_residual_capacity_is_mc_minus_rate_times_exec_time():
    np.testing.assert_allclose(residual_capacity([20, 20], [2.0, 0.0], [1.5, 3.0]), [17.0, 20.0])
    with pytest.raises(InvalidInput):
        residual_capacity([20], [-1.0], [1.0])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"sizes": [1.0], "residual": []}, "no nodes"),
        ({"sizes": [0.0], "residual": [1.0]}, "> 0"),
        ({"sizes": [float("nan")], "residual": [1.0]}, "finite"),
        ({"sizes": [[1.0]], "residual": [1.0]}, "1-D"),
        ({"sizes": [1.0], "residual": [1.0], "policy": "random"}, "unknown placement policy"),
        ({"sizes": [1.0], "residual": [1.0], "queue": [1.0, 2.0]}, "queue"),
    ],
)
def test_bad_input_raises_invalid_input_with_a_clear_message(kwargs, match):
    with pytest.raises(InvalidInput, match=match):
        place(**kwargs)


def test_empty_item_list_places_nothing():
    got = place([], [3.0, 4.0])
    assert got.assignment.size == 0 and got.nodes_used() == 0

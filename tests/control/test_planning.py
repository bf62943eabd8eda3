"""Hierarchy planning, re-planning and plan diffs against invariants and brute force (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from control_plane.errors import InvalidInput
from control_plane.planning import (
    TOP_ID,
    QueueEstimator,
    diff_plans,
    ewma,
    leaf_id,
    middle_id,
    plan_hierarchy,
    replan,
)


def check_tree(plan, expected):
    """Every update counted by exactly one leaf; goals add up level by level."""
    specs = {s.id: s for s in plan.aggregators()}
    for node, n in expected.items():
        leaves = [s for s in specs.values() if s.role == "leaf" and s.node == node]
        assert sum(s.goal for s in leaves) == n
        assert all(1 <= s.goal <= plan.per_leaf for s in leaves) or n == 0
        if n:
            assert specs[middle_id(node)].goal == len(leaves)
            assert all(s.parent == middle_id(node) for s in leaves)
        # each arrival index maps to one leaf, and each leaf gets exactly its goal
        hits: dict[str, int] = {}
        for j in range(n):
            lid = plan.leaf_for_arrival(node, j)
            hits[lid] = hits.get(lid, 0) + 1
        assert hits == {s.id: s.goal for s in leaves}
    active = [n for n, c in expected.items() if c > 0]
    if active:
        assert specs[TOP_ID].goal == len(active)
        assert plan.goal == sum(expected.values())


def test_ewma_follows_the_paper_formula_with_alpha_0_7():
    assert ewma(None, 10.0) == 10.0
    assert ewma(10.0, 0.0) == pytest.approx(7.0)
    q = None
    xs = [5.0, 9.0, 2.0, 0.0, 7.0]
    for x in xs:
        q = ewma(q, x)
    want = xs[0]
    for x in xs[1:]:
        want = 0.7 * want + 0.3 * x
    assert q == pytest.approx(want)


def test_queue_estimator_rounds_fractional_queues_up_to_whole_updates():
    est = QueueEstimator()
    est.observe({"a": 4.0, "b": 0.0})
    est.observe({"a": 5.0, "b": 1.0})
    assert est.estimates["a"] == pytest.approx(4.3)
    assert est.expected_updates() == {"a": 5, "b": 1}
    est.forget("b")
    assert "b" not in est.expected_updates()


def test_plan_has_ceil_n_over_i_leaves_per_node_and_one_top_on_the_busiest_node():
    rng = np.random.default_rng(0)
    for _ in range(200):
        expected = {f"n{i}": int(rng.integers(0, 30)) for i in range(int(rng.integers(1, 6)))}
        per_leaf = int(rng.integers(1, 5))
        plan = plan_hierarchy(expected, per_leaf)
        check_tree(plan, expected)
        for node, n in expected.items():
            np_ = plan.node_plan(node)
            assert (np_ is None and n == 0) or len(np_.leaf_goals) == math.ceil(n / per_leaf)
        if any(expected.values()):
            busiest = max(expected.values())
            assert plan.top_node == next(k for k, v in expected.items() if v == busiest)
        else:
            assert plan.top_node is None


def random_delivery(rng, plan):
    delivered, finished = {}, set()
    for s in plan.aggregators():
        if s.role == "leaf":
            d = int(rng.integers(0, s.goal + 1))
            if d:
                delivered[s.id] = d
            if d == s.goal and rng.random() < 0.5:
                finished.add(s.id)
    return delivered, finished


def test_replan_keeps_every_delivered_update_and_meets_the_new_goals():
    rng = np.random.default_rng(1)
    for _ in range(300):
        names = [f"n{i}" for i in range(4)]
        old = plan_hierarchy({n: int(rng.integers(0, 12)) for n in names}, int(rng.integers(1, 4)))
        delivered, finished = random_delivery(rng, old)
        new_expected = {n: int(rng.integers(0, 12)) for n in names if rng.random() < 0.8}
        new = replan(old, new_expected, delivered, finished)
        specs = {s.id: s for s in new.aggregators()}
        old_specs = {s.id: s for s in old.aggregators()}
        for lid, d in delivered.items():  # rule 1: delivered updates stay where they are
            assert lid in specs and specs[lid].goal >= d
        for lid in finished:  # finished leaves are frozen
            assert specs[lid].goal == old_specs[lid].goal
        for node in names:  # rule 2: goal = max(expected, delivered)
            here = sum(d for lid, d in delivered.items() if lid.startswith(node + ":"))
            want = max(new_expected.get(node, 0), here)
            np_ = new.node_plan(node)
            assert (0 if np_ is None else np_.expected) == want
            if np_ is not None:
                for m, (kids, _) in np_.generations().items():
                    assert specs[middle_id(node, m)].goal == kids
                    assert kids == sum(s.parent == middle_id(node, m) for s in specs.values())
        assert new.version == old.version + 1
        assert (new.top_node is None) == (not new.nodes)
        if old.top_node is not None and new.node_plan(old.top_node) is not None:
            assert new.top_node == old.top_node


def test_a_middle_whose_leaves_all_finished_takes_no_more_children_new_leaves_get_a_new_one():
    """Rule 5: a dead root's clients moved onto a node whose updates had all arrived (its
    middle finished, or will with its goal) go under a second middle, which the top counts."""
    old = plan_hierarchy({"a": 3, "b": 4}, 2)  # b: leaves 0, 1 full and finished
    full = {leaf_id("b", 0): 2, leaf_id("b", 1): 2}
    new = replan(old, {"b": 7}, full, full)
    specs = {s.id: s for s in new.aggregators()}
    assert specs[middle_id("b")].goal == 2  # unchanged: the finished middle keeps its goal
    assert (specs[middle_id("b", 1)].goal, specs[middle_id("b", 1)].parent) == (2, TOP_ID)
    assert [specs[leaf_id("b", k)].parent for k in range(4)] == [middle_id("b")] * 2 + [
        middle_id("b", 1)
    ] * 2
    assert [specs[leaf_id("b", k)].goal for k in range(4)] == [2, 2, 2, 1]
    assert specs[TOP_ID].goal == 2 and new.goal == 7
    d = diff_plans(old, new)
    assert {s.id for s in d.added} == {leaf_id("b", 2), leaf_id("b", 3), middle_id("b", 1)}
    assert middle_id("b") not in {o.id for o, _ in d.changed}
    # arrivals fill the old leaves first, then the new middle's
    assert [new.leaf_for_arrival("b", j) for j in (3, 4, 6)] == [
        leaf_id("b", 1),
        leaf_id("b", 2),
        leaf_id("b", 3),
    ]
    # a later re-plan grows the newest middle while it is open, and never the sealed one
    again = replan(new, {"b": 8}, {**full, leaf_id("b", 2): 1})
    sp = {s.id: s for s in again.aggregators()}
    assert sp[middle_id("b")].goal == 2 and sp[leaf_id("b", 0)].goal == 2
    assert sum(s.goal for s in sp.values() if s.parent == middle_id("b", 1)) == 4
    assert middle_id("b", 2) not in sp


def test_repeated_replans_never_change_a_sealed_middle_or_a_finished_leaf():
    rng = np.random.default_rng(7)
    for _ in range(200):
        names = [f"n{i}" for i in range(3)]
        plan = plan_hierarchy({n: int(rng.integers(0, 8)) for n in names}, int(rng.integers(1, 4)))
        sealed: dict[str, int] = {}  # middle id -> its goal once all its leaves finished
        done: dict[str, tuple[int, str | None]] = {}
        for _step in range(4):
            specs = {s.id: s for s in plan.aggregators()}
            delivered = {}
            for s in specs.values():  # leaves that finished stay full; others fill at random
                if s.role == "leaf":
                    d = s.goal if s.id in done else int(rng.integers(0, s.goal + 1))
                    if d:
                        delivered[s.id] = d
                    if d == s.goal and s.id not in done and rng.random() < 0.6:
                        done[s.id] = (s.goal, s.parent)
            for s in specs.values():
                kids = [k for k in specs.values() if k.parent == s.id]
                if s.role == "middle" and kids and all(k.id in done for k in kids):
                    sealed.setdefault(s.id, s.goal)
            more = {n: int(rng.integers(0, 10)) for n in names}
            plan = replan(plan, more, delivered, done)
            specs = {s.id: s for s in plan.aggregators()}
            for lid, (g, parent) in done.items():
                assert (specs[lid].goal, specs[lid].parent) == (g, parent)
            for mid, g in sealed.items():
                assert specs[mid].goal == g
            if plan.nodes:
                assert specs[TOP_ID].goal == sum(s.role == "middle" for s in specs.values())


def test_replan_with_nothing_delivered_and_same_counts_changes_nothing():
    old = plan_hierarchy({"a": 5, "b": 3})
    new = replan(old, {"a": 5, "b": 3})
    d = diff_plans(old, new)
    assert d.empty and new.nodes == old.nodes


def test_diff_lists_added_removed_and_changed_aggregators_exactly():
    old = plan_hierarchy({"a": 4, "b": 2})  # a: leaves 0,1 ; b: leaf 0 ; top on a
    new = replan(old, {"a": 7, "b": 0}, delivered={leaf_id("a", 0): 1})
    d = diff_plans(old, new)
    assert {s.id for s in d.added} == {leaf_id("a", 2), leaf_id("a", 3)}
    assert set(d.removed) == {leaf_id("b", 0), middle_id("b")}
    changed = {o.id: (o.goal, n.goal) for o, n in d.changed}
    assert changed[middle_id("a")] == (2, 4)
    assert changed[TOP_ID] == (2, 1)
    # applying the diff to the old plan's aggregators gives the new plan's
    table = {s.id: s for s in old.aggregators()}
    for i in d.removed:
        del table[i]
    for _, s in d.changed:
        table[s.id] = s
    for s in d.added:
        table[s.id] = s
    assert table == {s.id: s for s in new.aggregators()}


def test_top_moving_to_another_node_reroutes_the_middles():
    old = plan_hierarchy({"a": 4, "b": 2})
    new = replan(old, {"a": 0, "b": 2, "c": 1})
    assert new.top_node == "b"
    d = diff_plans(old, new)
    assert middle_id("b") in d.rerouted


@pytest.mark.parametrize(
    "call",
    [
        lambda: plan_hierarchy({"a": -1}),
        lambda: plan_hierarchy({"a": 1}, per_leaf=0),
        lambda: plan_hierarchy({"a:b": 1}),
        lambda: ewma(None, -1.0),
        lambda: ewma(1.0, 1.0, alpha=1.5),
        lambda: replan(plan_hierarchy({"a": 2}), {"a": 2}, delivered={"a:leaf:0": -1}),
        lambda: plan_hierarchy({"a": 2}).leaf_for_arrival("a", 2),
    ],
)
def test_bad_planning_input_raises_invalid_input(call):
    with pytest.raises(InvalidInput):
        call()

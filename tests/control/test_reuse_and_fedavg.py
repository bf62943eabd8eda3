"""Replica reuse rules, and the tree's FedAvg equals flat FedAvg on every path (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness.lifl_sim import FIG8_VARIANTS, CostModel, Variant, simulate_round
from control_plane.planning import TOP_ID, leaf_id, middle_id, plan_hierarchy
from control_plane.reuse import AggregatorState, ReplicaState, assign_replicas

COSTS = CostModel(agg_s=0.01, cold_s=0.5, cold_cpu_s=0.3, xfer_s=0.05, xfer_cpu_s=0.04, key_s=1e-5)


def test_leaves_take_idle_warm_replicas_before_any_new_one():
    plan = plan_hierarchy({"a": 6, "b": 2})  # a: 3 leaves, b: 1 leaf
    warm = [
        ReplicaState("r2", "a", True),
        ReplicaState("r1", "a", True),
        ReplicaState("r9", "b", False),
    ]
    got = assign_replicas(plan, {}, warm)
    assert got.bind == {leaf_id("a", 0): "r1", leaf_id("a", 1): "r2"}
    assert got.new == {leaf_id("a", 2): "a", leaf_id("b", 0): "b"}
    assert got.new_replicas() == {"a": 1, "b": 1}
    assert set(got.deferred) == {middle_id("a"), middle_id("b"), TOP_ID}


def test_first_finished_leaf_becomes_the_middle_and_first_finished_middle_the_top():
    plan = plan_hierarchy({"a": 4, "b": 2})
    st = {
        leaf_id("a", 0): AggregatorState("done", "ra0", done_seq=2),
        leaf_id("a", 1): AggregatorState("done", "ra1", done_seq=1),
        leaf_id("b", 0): AggregatorState("running", "rb0"),
    }
    got = assign_replicas(
        plan, st, [ReplicaState("ra0", "a", True), ReplicaState("ra1", "a", True)]
    )
    assert got.bind == {middle_id("a"): "ra1"}
    assert got.new == {}
    assert set(got.deferred) == {middle_id("b"), TOP_ID}
    st[middle_id("a")] = AggregatorState("done", "ra1", done_seq=3)
    st[leaf_id("b", 0)] = AggregatorState("done", "rb0", done_seq=4)
    st[middle_id("b")] = AggregatorState("running", "rb0")
    got = assign_replicas(plan, st)
    assert got.bind == {TOP_ID: "ra1"}
    assert not got.new and not got.deferred


def test_a_replica_promoted_to_middle_is_not_handed_out_again():
    plan = plan_hierarchy({"a": 2, "b": 2})
    st = {
        leaf_id("a", 0): AggregatorState("done", "r1", done_seq=1),
        middle_id("a"): AggregatorState("running", "r1"),
    }
    got = assign_replicas(plan, st, [ReplicaState("r1", "a", True)])
    assert "r1" not in got.bind.values()


def test_without_reuse_every_unbound_aggregator_needs_a_new_replica():
    plan = plan_hierarchy({"a": 3, "b": 1})
    got = assign_replicas(plan, {}, [ReplicaState("r1", "a", True)], reuse=False)
    assert len(got.new) == len(plan.aggregators()) == 2 + 1 + 2 + 1
    assert got.new_replicas() == {"a": 4, "b": 2}


def test_reuse_never_starts_more_replicas_than_leaves():
    rng = np.random.default_rng(5)
    for _ in range(50):
        expected = {f"n{i}": int(rng.integers(0, 15)) for i in range(4)}
        plan = plan_hierarchy(expected)
        n_leaves = sum(len(n.leaf_goals) for n in plan.nodes)
        # replay completions in random order, binding as the rules say
        st: dict[str, AggregatorState] = {}
        created = 0
        for seq in range(1, 201):
            got = assign_replicas(plan, st)
            for aid, rid in got.bind.items():
                st[aid] = AggregatorState("running", rid)
            for aid in got.new:
                created += 1
                st[aid] = AggregatorState("running", f"r{created}")
            running = [a for a, s in st.items() if s.status == "running"]
            if not running:
                break
            pick = running[int(rng.integers(0, len(running)))]
            st[pick] = AggregatorState("done", st[pick].replica, done_seq=seq)
        assert created == n_leaves
        assert all(s.status == "done" for s in st.values())
        assert len(st) == len(plan.aggregators())


def flat_fedavg(x, w):
    return (w[:, None] * x).sum(axis=0) / w.sum()


@pytest.mark.parametrize("variant", FIG8_VARIANTS, ids=lambda v: v.name)
def test_tree_fedavg_equals_flat_fedavg_exactly_on_every_path(variant):
    rng = np.random.default_rng(11)
    for n in (1, 2, 7, 20, 61):
        x = rng.integers(-50, 50, size=(n, 9)).astype(np.float64)  # sums of these are exact
        w = rng.integers(1, 40, size=n).astype(np.float64)
        arrival = rng.uniform(0, 2, size=n)
        res = simulate_round([20.0] * 5, variant, COSTS, arrival, updates=x, weights=w)
        assert res.weight == w.sum()
        np.testing.assert_array_equal(res.weighted_sum, (w[:, None] * x).sum(axis=0))
        np.testing.assert_allclose(res.model, flat_fedavg(x, w), rtol=1e-12)


def test_tree_fedavg_with_random_float_updates_matches_np_average():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 50))
    w = rng.integers(1, 100, 37).astype(float)
    for eager in (True, False):
        v = Variant("x", "bestfit", True, True, eager)
        res = simulate_round([8.0] * 6, v, COSTS, rng.uniform(0, 1, 37), updates=x, weights=w)
        np.testing.assert_allclose(res.model, np.average(x, axis=0, weights=w), rtol=1e-10)


def test_fig8_model_uses_fewer_nodes_and_replicas_with_lifl_features():
    arrival = np.random.default_rng(0).uniform(0, 1, 20)
    base = simulate_round([20.0] * 5, FIG8_VARIANTS[0], COSTS, arrival)
    lifl = simulate_round([20.0] * 5, FIG8_VARIANTS[-1], COSTS, arrival)
    assert base.nodes_used == 5 and lifl.nodes_used == 1
    assert lifl.created < base.created
    assert lifl.cross_node == 0 < base.cross_node

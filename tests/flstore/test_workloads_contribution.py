"""Contributions on a validation set: leave-one-out, Shapley (exact, GTG, TMC), incentives."""

from __future__ import annotations

import numpy as np
import pytest

from flstore_workloads import WorkloadData, get
from flstore_workloads.contribution import distribute, exact_shapley, permutation_shapley

from .test_workloads_common import attacked_round, evaluator, small_round


def test_exact_shapley_gives_identical_clients_equal_values_and_is_efficient() -> None:
    res = get("shapley").run(
        small_round().workload_data(with_evaluator=True), {"round": 1, "method": "exact"}
    )
    v = res["values"]
    assert v["c03"] == pytest.approx(v["c04"], abs=1e-12)  # c04 is a copy of c03
    assert sum(v.values()) == pytest.approx(res["v_full"] - res["v_empty"], abs=1e-12)
    assert res["evaluations"] == 2**5


def test_gtg_shapley_is_efficient_close_to_exact_and_deterministic() -> None:
    data = small_round().workload_data(with_evaluator=True)
    exact = get("shapley").run(data, {"round": 1, "method": "exact"})["values"]
    gtg = get("shapley").run(data, {"round": 1, "method": "gtg", "seed": 7})
    assert gtg["sum"] == pytest.approx(gtg["v_full"] - gtg["v_empty"], abs=1e-3)  # within eps
    assert gtg["values"]["c03"] == pytest.approx(gtg["values"]["c04"], abs=0.01)
    for c, x in exact.items():
        assert gtg["values"][c] == pytest.approx(x, abs=0.01)
    again = get("shapley").run(
        small_round().workload_data(with_evaluator=True), {"round": 1, "seed": 7}
    )
    assert again["values"] == gtg["values"]


def test_gtg_gives_the_attackers_the_two_lowest_and_negative_values() -> None:
    res = get("shapley").run(attacked_round().workload_data(with_evaluator=True), {"round": 1})
    ranking = sorted(res["values"], key=res["values"].get)
    assert set(ranking[:2]) == {"c08", "c09"}
    assert res["values"]["c08"] < 0 and res["values"]["c09"] < 0
    assert res["sum"] == pytest.approx(res["v_full"] - res["v_empty"], abs=1e-3)


def test_permutation_shapley_telescopes_exactly_without_truncation_on_a_smooth_utility() -> None:
    rng = np.random.default_rng(0)
    target = rng.normal(size=20)
    deltas = rng.normal(size=(6, 20))

    def v(s: tuple[int, ...] | list[int]) -> float:
        model = deltas[list(s)].mean(axis=0) if len(s) else np.zeros(20)
        return -float(np.linalg.norm(model - target))

    for guided in (True, False):
        phi, info = permutation_shapley(v, 6, guided=guided, eps=0.0, seed=1)
        assert phi.sum() == pytest.approx(v(range(6)) - v(()), abs=1e-12)
        assert info["permutations"] >= 30
        phi, info = permutation_shapley(v, 6, guided=guided, eps=0.05, seed=1)
        assert abs(phi.sum() - (v(range(6)) - v(()))) <= 0.05


def test_round_truncation_sets_every_value_to_zero_when_the_round_barely_helps() -> None:
    res = get("shapley").run(
        small_round().workload_data(with_evaluator=True), {"round": 1, "round_trunc_threshold": 1.0}
    )
    assert res["round_truncated"] is True and set(res["values"].values()) == {0.0}
    # the same keys as any other answer (the demo read "converged" and failed without it)
    full = get("shapley").run(small_round().workload_data(with_evaluator=True), {"round": 1})
    assert set(full) <= set(res), set(full) - set(res)


def test_exact_shapley_of_an_additive_game_is_each_players_own_value() -> None:
    a = np.array([0.3, -0.1, 0.5, 0.0])
    np.testing.assert_allclose(exact_shapley(lambda s: float(a[list(s)].sum()), 4), a, atol=1e-12)


def test_leave_one_out_matches_brute_force_evaluation() -> None:
    fed = small_round()
    res = get("leave-one-out").run(fed.workload_data(with_evaluator=True), {"round": 1})
    ev = evaluator()
    clients = sorted(fed.updates[1])
    n = {c: float(fed.client_meta[1][c]["n_samples"]) for c in clients}

    def fedavg(members: list[str]) -> np.ndarray:
        w = np.array([n[c] for c in members])
        return (
            w @ np.stack([fed.updates[1][c].astype(np.float64) for c in members]) / w.sum()
        ).astype(np.float32)

    full = ev(fedavg(clients))
    assert res["v_full"] == pytest.approx(full)
    for c in clients:
        assert res["values"][c] == pytest.approx(
            full - ev(fedavg([o for o in clients if o != c])), abs=1e-12
        )
    assert res["values"]["c03"] == res["values"]["c04"]


def test_incentives_pay_the_budget_in_proportion_to_positive_contributions() -> None:
    res = get("incentives").run(
        attacked_round().workload_data(with_evaluator=True),
        {"round": 1, "budget": 1000.0, "contribution": "loo"},
    )
    contrib, pay = res["contributions"], res["payouts"]
    positive = {c: x for c, x in contrib.items() if x > 0}
    assert res["paid"] == pytest.approx(1000.0 if positive else 0.0)
    for c, x in contrib.items():
        assert pay[c] == pytest.approx(1000.0 * x / sum(positive.values()) if x > 0 else 0.0)
    assert pay["c08"] == 0.0 and pay["c09"] == 0.0
    np.testing.assert_array_equal(distribute(np.array([-1.0, -2.0]), 10.0), [0.0, 0.0])


def test_contribution_workloads_need_an_evaluator() -> None:
    from flstore_workloads import MissingData

    data: WorkloadData = small_round().workload_data(with_evaluator=False)
    with pytest.raises(MissingData) as err:
        get("shapley").run(data, {"round": 1})
    assert err.value.kind == "evaluator" and err.value.workload == "shapley"


def _gtg_one_permutation_at_a_time(v, n, *, seed=0, eps=0.001, converge_min=None, max_perms=500):  # type: ignore[no-untyped-def]
    """GTG-Shapley as the paper's procedure reads (the code before batching): each permutation
    of a cycle walked to its end (or truncation) before the next starts."""
    from flstore_workloads.contribution import _not_converged

    rng = np.random.default_rng(seed)
    v_empty, v_full = v(()), v(tuple(range(n)))
    if abs(v_full - v_empty) <= 0.01:
        return np.zeros(n), 0
    cmin = max(30, n) if converge_min is None else converge_min
    records: list = []
    truncations = 0
    while len(records) < max_perms and _not_converged(records, cmin, 10, 0.05):
        for first in range(n):
            if len(records) >= max_perms:
                break
            rest = rng.permutation([i for i in range(n) if i != first])
            perm = np.concatenate(([first], rest)).astype(int)
            marginal, prev = np.zeros(n), v_empty
            for j in range(n):
                if abs(v_full - prev) >= eps:
                    cur = v(tuple(perm[: j + 1]))
                else:
                    cur = prev
                    truncations += 1
                marginal[perm[j]] = cur - prev
                prev = cur
            records.append(marginal)
    return np.mean(records, axis=0), truncations


class _Counting:
    """A utility that counts the coalitions it is asked for, one by one or in batches."""

    def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
        self.f, self.asked, self.batches = f, set(), 0

    def __call__(self, s) -> float:  # type: ignore[no-untyped-def]
        key = tuple(sorted(int(i) for i in s))
        self.asked.add(key)
        return float(self.f(key))

    def prefetch(self, coalitions) -> None:  # type: ignore[no-untyped-def]
        self.batches += 1
        for c in coalitions:
            self(c)


@pytest.mark.parametrize("seed", [0, 5])
def test_gtg_position_by_position_gives_the_values_of_one_permutation_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 9
    gains = rng.normal(0.05, 0.04, n)
    gains[3] = -0.08  # a harmful client

    def accuracy(s: tuple[int, ...]) -> float:  # saturating, quantised like an accuracy
        return round(0.1 + 0.8 * (1 - np.exp(-max(0.0, float(gains[list(s)].sum()) * 40))), 3)

    want, truncations = _gtg_one_permutation_at_a_time(accuracy, n, seed=seed)
    v = _Counting(accuracy)
    got, info = permutation_shapley(v, n, seed=seed)
    np.testing.assert_array_equal(got, want)
    assert info["truncated_marginals"] == truncations > 0
    # the prefixes of a cycle's permutations were asked for together, a position at a time
    assert v.batches <= 1 + info["permutations"] // n * n + n
    plain: set = set()
    _gtg_one_permutation_at_a_time(
        lambda s: plain.add(tuple(sorted(s))) or accuracy(s), n, seed=seed
    )  # type: ignore[func-returns-value]
    assert v.asked == plain  # nothing evaluated that one at a time would not evaluate
    # small models through an evaluator function: a cycle's prefixes at once, same values
    ahead = _Counting(accuracy)
    ahead.ahead = True  # type: ignore[attr-defined]
    got, info = permutation_shapley(ahead, n, seed=seed)
    np.testing.assert_array_equal(got, want)
    assert info["truncated_marginals"] == truncations and ahead.asked > plain
    assert ahead.batches <= 1 + 2 * info["permutations"] // n * n


def test_utilities_are_reused_across_queries_on_the_same_sealed_vectors() -> None:
    from flstore_workloads.utility import UtilityCache

    fed = attacked_round()
    ev = evaluator()
    cache = UtilityCache()

    def data() -> WorkloadData:
        return WorkloadData(
            updates=fed.updates,
            globals=fed.globals,
            client_meta=fed.client_meta,
            evaluator=ev,
            utility_cache=cache,
        )

    loo = get("leave-one-out").run(data(), {"round": 1})
    assert len(cache) == 11 and cache.hits == 0
    again = get("leave-one-out").run(data(), {"round": 1})
    assert again == loo and cache.hits == 11  # nothing evaluated twice
    shap = get("shapley").run(data(), {"round": 1, "max_permutations": 20})
    assert shap == get("shapley").run(fed.workload_data(True), {"round": 1, "max_permutations": 20})
    assert cache.hits >= 11 + 1  # v(N) at least came from leave-one-out
    # a writable vector is never keyed: it may change under the same identity
    loose = {1: {c: np.array(w) for c, w in fed.updates[1].items()}}
    size, hits = len(cache), cache.hits
    get("leave-one-out").run(
        WorkloadData(
            updates=loose,
            globals=fed.globals,
            client_meta=fed.client_meta,
            evaluator=ev,
            utility_cache=cache,
        ),
        {"round": 1},
    )
    assert (len(cache), cache.hits) == (size, hits)


def test_every_estimate_parameter_reaches_permutation_shapley_by_its_name() -> None:
    """``shapley_values`` passes ``PERMUTATION_KNOBS`` on by name: each is a parameter of the
    workload and a keyword of the estimator (a rename would otherwise fall back to a default)."""
    import inspect

    from flstore_workloads.contribution import (
        PERMUTATION_KNOBS,
        ShapleyParams,
        permutation_shapley,
    )

    keywords = inspect.signature(permutation_shapley).parameters
    assert set(PERMUTATION_KNOBS) <= set(ShapleyParams.model_fields) & set(keywords)

"""The sharded rules (core.robust) against a plain numpy reference and against Flower.

The shard kernels run over ranges of a few thousand coordinates split in several shards (and
blocks smaller than a shard, to cross block edges); the result must not depend on the split.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.server.strategy.aggregate import (
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)

from core import robust
from core.robust import RobustRule, RuleError

N, D = 12, 5_003


def _round(seed: int = 0, n: int = N, d: int = D, bad: int = 2):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=d).astype(np.float32)
    honest = g + rng.normal(0, 0.05, size=(n, d)).astype(np.float32) + 0.1
    ups = [honest[i].copy() for i in range(n)]
    for i in range(bad):  # sign-flipped and scaled deltas
        ups[i] = (g - 100 * (honest[i] - g)).astype(np.float32)
    samples = [float(10 + i) for i in range(n)]
    return g, ups, samples


def _sharded(rule: RobustRule, ups, g, samples, shards: int, root=None, monkeypatch=None):
    d = g.shape[0]
    out = np.full(d, np.nan, dtype=np.float32)
    bounds = robust.shard_bounds(d, shards)
    if rule.uses_gram:
        gram = sum(
            robust.gram_shard(ups, g, a, b) for a, b in zip(bounds, bounds[1:], strict=False)
        )
        choice = robust.coefficients(rule, gram, samples, root)
        for a, b in zip(bounds, bounds[1:], strict=False):
            robust.reduce_linear(choice.coef, ups, g, a, b, out)
        return out, choice
    for a, b in zip(bounds, bounds[1:], strict=False):
        robust.reduce_order(rule, ups, a, b, out)
    return out, None


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(robust, "BLOCK", 700)  # blocks cross shard edges and end mid-shard


@pytest.mark.parametrize("shards", [1, 3, 8])
@pytest.mark.parametrize(
    "spec",
    [
        {"rule": "median"},
        {"rule": "trimmed-mean", "beta": 0.2},
        {"rule": "krum", "f": 2},
        {"rule": "multi-krum", "f": 2, "m": 5},
        {"rule": "multi-krum", "f": 2},
        {"rule": "fltrust", "root_client": "c5"},
    ],
)
def test_sharded_rules_equal_the_numpy_reference(spec, shards):
    rule = RobustRule.from_json(spec)
    g, ups, samples = _round()
    root = 5 if rule.rule == "fltrust" else None
    out, _ = _sharded(rule, ups, g, samples, shards, root)
    ref = robust.reference(rule, ups, g, samples, root)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert robust.far(out, ref) < 1e-6


def test_the_rules_equal_flowers_on_the_same_inputs():
    g, ups, samples = _round(1)
    results = [
        ([u[:3000].reshape(30, 100), u[3000:]], int(s)) for u, s in zip(ups, samples, strict=False)
    ]

    def flat(arrays):
        return np.concatenate([np.ravel(a) for a in arrays])

    med, _ = _sharded(RobustRule.from_json({"rule": "median"}), ups, g, samples, 4)
    np.testing.assert_array_equal(med, flat(aggregate_median(results)))
    tm, _ = _sharded(
        RobustRule.from_json({"rule": "trimmed-mean", "beta": 0.2}), ups, g, samples, 4
    )
    np.testing.assert_allclose(tm, flat(aggregate_trimmed_avg(results, 0.2)), rtol=1e-6, atol=1e-6)
    kr, _ = _sharded(RobustRule.from_json({"rule": "krum", "f": 2}), ups, g, samples, 4)
    np.testing.assert_array_equal(kr, flat(aggregate_krum(results, 2, 0)))
    mk, choice = _sharded(
        RobustRule.from_json({"rule": "multi-krum", "f": 2, "m": 6}), ups, g, samples, 4
    )
    np.testing.assert_allclose(mk, flat(aggregate_krum(results, 2, 6)), rtol=1e-5, atol=1e-6)
    assert choice is not None and not {0, 1} & set(choice.detail["selected"])


def test_poisoned_updates_move_fedavg_far_and_each_rule_stays_near_the_honest_mean():
    g, ups, samples = _round(2, n=20, bad=4)
    honest = np.mean(np.stack(ups[4:]).astype(np.float64), axis=0)
    fedavg = np.average(np.stack(ups).astype(np.float64), axis=0, weights=samples)
    # distances relative to the honest mean update (honest - g)
    assert robust.far(fedavg - g, honest - g) > 10.0
    for spec, root in [
        ({"rule": "median"}, None),
        ({"rule": "trimmed-mean", "beta": 0.2}, None),
        ({"rule": "krum", "f": 4}, None),
        ({"rule": "multi-krum", "f": 4}, None),
        ({"rule": "fltrust", "root_client": "c"}, 10),
    ]:
        out, _ = _sharded(RobustRule.from_json(spec), ups, g, samples, 2, root)
        assert robust.far(out - g, honest - g) < 0.5, spec


def test_fltrust_without_its_root_update_keeps_the_model():
    g, ups, samples = _round(3)
    rule = RobustRule.from_json({"rule": "fltrust", "root_client": "c0"})
    out, choice = _sharded(rule, ups, g, samples, 2, None)
    np.testing.assert_array_equal(out, g)
    assert choice is not None and choice.detail["root"] is None


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("median", "JSON object"),
        ({"rule": "mean"}, "unknown"),
        ({"rule": "median", "beta": 0.1}, "not beta"),
        ({"rule": "trimmed-mean", "beta": 0.5}, "[0, 0.5)"),
        ({"rule": "krum", "f": -1}, ">= 0"),
        ({"rule": "krum", "f": 1.5}, "integer"),
        ({"rule": "multi-krum", "m": -2}, ">= 0"),
        ({"rule": "fltrust"}, "root_client"),
        ({"rule": "median", "shards": 65}, "0..64"),
    ],
)
def test_bad_specs_say_what_to_change(spec, says):
    with pytest.raises(RuleError, match=None) as err:
        RobustRule.from_json(spec)
    assert says in str(err.value)


def test_too_few_updates_for_the_rule_are_refused():
    with pytest.raises(RuleError, match="at least 5"):
        RobustRule.from_json({"rule": "krum", "f": 2}).check_count(4)
    RobustRule.from_json({"rule": "median"}).check_count(1)


def test_shard_bounds_cover_the_range_in_cache_lines():
    for n, s in [(10, 4), (1000, 3), (11_000_000, 2), (17, 64)]:
        b = robust.shard_bounds(n, s)
        assert b[0] == 0 and b[-1] == n and all(x < y for x, y in zip(b, b[1:], strict=False))
        assert all(x % 16 == 0 for x in b[:-1])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 20, 33, 64])
def test_the_sorting_network_sorts_every_column(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 257)).astype(np.float32)
    x[:, :3] = 1.0  # ties
    rows = [r.copy() for r in x]
    for i, j in robust.sorting_network(n):
        lo, hi = np.minimum(rows[i], rows[j]), np.maximum(rows[i], rows[j])
        rows[i], rows[j] = lo, hi
    np.testing.assert_array_equal(np.stack(rows), np.sort(x, axis=0))


def test_past_the_network_the_partition_path_gives_the_same_answers(monkeypatch):
    g, ups, samples = _round(4, n=9)
    for spec in ({"rule": "median"}, {"rule": "trimmed-mean", "beta": 0.2}):
        rule = RobustRule.from_json(spec)
        net, _ = _sharded(rule, ups, g, samples, 3)
        monkeypatch.setattr(robust, "NETWORK_MAX", 4)
        part, _ = _sharded(rule, ups, g, samples, 3)
        monkeypatch.setattr(robust, "NETWORK_MAX", 64)
        np.testing.assert_allclose(net, part, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            net, robust.reference(rule, ups, g, samples), rtol=1e-5, atol=1e-6
        )

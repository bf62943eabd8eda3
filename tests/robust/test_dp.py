"""Central DP (issue 15, item 3): DP-FedAvg's sharded kernels against a numpy reference and
Flower's fixed-clipping wrapper, its noise's standard deviation and seeding, and the privacy
accountant against dp-accounting's own computation."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from core import privacy, robust, shards
from core.robust import Noise, RobustRule, RuleError

N, D = 10, 6_007


def _round(seed: int = 0, n: int = N, d: int = D):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=d).astype(np.float32)
    # deltas of norms spread around the clip: some clipped, some not
    ups = [(g + rng.normal(0, 0.002 * (i + 1), size=d)).astype(np.float32) for i in range(n)]
    return g, ups


def _dp(ups, g, rule: RobustRule, n_shards: int, expected: int, seed: int = 1):
    """The gateway's two passes, in process: norms shard by shard, then the noisy sum."""
    bounds = robust.shard_bounds(g.shape[0], n_shards)
    ranges = list(zip(bounds, bounds[1:], strict=False))
    gram = sum(robust.gram_shard(ups, g, a, b, diagonal=True) for a, b in ranges)
    choice = robust.coefficients(rule, gram, [1.0] * len(ups), expected=expected)
    noise = Noise(float(choice.detail["noise_std"]), seed)
    out = np.full(g.shape[0], np.nan, dtype=np.float32)
    for a, b in ranges:
        robust.reduce_linear(choice.coef, ups, g, a, b, out, noise)
    return out, choice, bounds


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(robust, "BLOCK", 700)  # blocks cross shard edges and end mid-shard


@pytest.mark.parametrize("n_shards", [1, 3, 8])
@pytest.mark.parametrize("expected", [0, N, 16])
def test_clipped_sum_over_the_goal_equals_the_reference_for_any_split(n_shards, expected):
    g, ups = _round()
    rule = RobustRule.from_json({"rule": "dp-fedavg", "clip": 0.25, "noise_multiplier": 0})
    out, choice, _ = _dp(ups, g, rule, n_shards, expected)
    ref = robust.reference(rule, ups, g, [1.0] * N, expected=expected)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    norms = np.array([np.linalg.norm(u.astype(np.float64) - g) for u in ups])
    np.testing.assert_allclose(choice.detail["norms"], norms, rtol=1e-9)
    assert choice.detail["clipped"] == [i for i in range(N) if norms[i] > 0.25]
    assert 0 < len(choice.detail["clipped"]) < N  # the case is a real mix
    assert choice.detail["denominator"] == (expected or N)


def test_the_diagonal_gram_pass_is_the_full_passes_diagonal():
    g, ups = _round(1)
    full = robust.gram_shard(ups, g, 100, 5000)
    diag = robust.gram_shard(ups, g, 100, 5000, diagonal=True)
    np.testing.assert_allclose(np.diag(diag), np.diag(full), rtol=1e-12)
    assert not np.any(diag - np.diag(np.diag(diag)))


def test_without_noise_it_equals_flowers_fixed_clipping_around_fedavg():
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    g, ups = _round(2)
    split = [3000]
    strategy = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(), noise_multiplier=0.0, clipping_norm=0.25, num_sampled_clients=N
    )
    strategy.current_round_params = np.split(g, split)  # what configure_fit records
    results = [
        (None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(np.split(u, split)), 32, {}))
        for u in ups
    ]
    want, _ = strategy.aggregate_fit(1, results, [])
    assert want is not None
    rule = RobustRule.from_json({"rule": "dp-fedavg", "clip": 0.25, "noise_multiplier": 0})
    out, _, _ = _dp(ups, g, rule, 3, N)
    np.testing.assert_allclose(
        out, np.concatenate(parameters_to_ndarrays(want)), rtol=1e-5, atol=1e-6
    )


def test_the_noise_has_the_configured_standard_deviation_and_its_seed_fixes_it(monkeypatch):
    monkeypatch.setattr(robust, "BLOCK", 1 << 16)
    d, n, clip, z = 400_000, 8, 0.5, 1.3
    rng = np.random.default_rng(3)
    g = rng.normal(size=d).astype(np.float32)
    ups = [g.copy() for _ in range(n)]  # zero deltas: the result is g plus the noise alone
    rule = RobustRule.from_json({"rule": "dp-fedavg", "clip": clip, "noise_multiplier": z})
    out, choice, bounds = _dp(ups, g, rule, 4, n, seed=42)
    std = z * clip / n
    assert choice.detail["noise_std"] == pytest.approx(std)
    noise = out.astype(np.float64) - g
    # the sample std of 400k normals is within 0.5% of sigma (5 standard errors: 1/sqrt(2d))
    assert abs(noise.std() / std - 1) < 5 / math.sqrt(2 * d)
    assert abs(noise.mean()) < 5 * std / math.sqrt(d)
    # each shard's range is independent noise, not a repeat of another's
    a, b = bounds[0], bounds[1]
    assert abs(np.corrcoef(noise[a : a + 50_000], noise[b : b + 50_000])[0, 1]) < 0.02
    again, _, _ = _dp(ups, g, rule, 4, n, seed=42)
    np.testing.assert_array_equal(again, out)  # a shard sent again writes the same bytes
    other, _, _ = _dp(ups, g, rule, 4, n, seed=43)
    assert not np.array_equal(other, out)


def test_the_manifest_carries_the_noise_and_reads_back():
    p = shards.Pass(
        shards.LINEAR,
        {"rule": "dp-fedavg"},
        [b"\x01" * 16],
        b"\x02" * 16,
        b"\x03" * 16,
        [0, 16],
        [0.5],
        Noise(0.01, (1 << 127) + 5),
    )
    buf = memoryview(bytearray(p.nbytes()))
    p.write(buf)
    assert shards.read(buf) == p


@pytest.mark.parametrize("rates", [[0.2] * 5, [0.01] * 100, [1.0] * 3, [0.2, 0.25, 0.2, 1.0, 0.25]])
def test_the_accountant_equals_dp_accountings_own_computation(rates):
    z, delta = 1.1, 1e-5
    acc = RdpAccountant()
    for q in rates:  # one event per round, in the order they ran
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
    assert privacy.epsilon(z, rates, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-9)


def test_the_accountant_grows_with_rounds_and_has_no_bound_without_noise():
    eps = [privacy.epsilon(1.0, [0.1] * k, 1e-5) for k in (0, 1, 10, 100)]
    assert eps[0] == 0 and eps[1] < eps[2] < eps[3]
    assert privacy.epsilon(0.0, [0.1], 1e-5) == math.inf


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"rule": "dp-fedavg", "clip": 1.0}, "noise_multiplier"),
        ({"rule": "dp-fedavg", "clip": 0, "noise_multiplier": 1}, "clip must be > 0"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": -1}, ">= 0"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 1, "delta": 1}, "(0, 1)"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 1, "epsilon": 0}, "> 0"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 0, "epsilon": 8}, "no noise"),
        ({"rule": "dp-fedavg", "clip": "1", "noise_multiplier": 1}, "finite number"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 1, "seed": -1}, "seed"),
        ({"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 1, "f": 1}, "not f"),
        (
            {"rule": "dp-fedavg", "clip": 1, "noise_multiplier": 1, "epsilon": 8, "seed": 1},
            "not both",
        ),
    ],
)
def test_bad_dp_specs_say_what_to_change(spec, says):
    with pytest.raises(RuleError) as err:
        RobustRule.from_json(spec)
    assert says in str(err.value)


def test_a_dp_spec_round_trips_with_its_defaults():
    rule = RobustRule.from_json({"rule": "dp-fedavg", "clip": 2, "noise_multiplier": 1})
    assert rule.delta == robust.DEFAULT_DELTA and rule.epsilon is None and rule.seed is None
    assert RobustRule.from_json(rule.to_json()) == rule
    full = {
        "rule": "dp-fedavg",
        "clip": 2.0,
        "noise_multiplier": 1.0,
        "delta": 1e-6,
        "epsilon": 4.0,
        "shards": 3,
    }
    assert RobustRule.from_json(full).to_json() == full
    seeded = {**full, "seed": 9}
    del seeded["epsilon"]
    assert RobustRule.from_json(seeded).to_json() == seeded

"""Non-IID split of the bundled digits data (client.data)."""

from __future__ import annotations

import numpy as np
import pytest

from client.data import dirichlet_partition, federated_digits, load_digits_arrays


def test_every_sample_is_used_exactly_once_across_clients_and_test_set() -> None:
    fd = federated_digits(20, alpha=0.5, seed=1)
    rows = np.concatenate([c.indices for c in fd.clients] + [fd.test_indices])
    x, y = load_digits_arrays()
    assert len(rows) == len(y) == 1797
    assert len(np.unique(rows)) == len(rows)
    for c in fd.clients:
        np.testing.assert_array_equal(c.x, x[c.indices])
        np.testing.assert_array_equal(c.y, y[c.indices])


def test_same_seed_gives_the_same_split_and_another_seed_does_not() -> None:
    a = federated_digits(10, alpha=0.3, seed=7)
    b = federated_digits(10, alpha=0.3, seed=7)
    c = federated_digits(10, alpha=0.3, seed=8)
    for ca, cb in zip(a.clients, b.clients, strict=True):
        np.testing.assert_array_equal(ca.indices, cb.indices)
    np.testing.assert_array_equal(a.test_indices, b.test_indices)
    assert any(
        not np.array_equal(ca.indices, cc.indices)
        for ca, cc in zip(a.clients, c.clients, strict=True)
    )


def test_every_client_gets_at_least_min_samples_even_with_extreme_skew() -> None:
    fd = federated_digits(40, alpha=0.05, seed=3, min_samples=8)
    assert min(c.num_samples for c in fd.clients) >= 8
    assert [c.client_id for c in fd.clients][:2] == ["client-000", "client-001"]


def test_small_alpha_skews_labels_much_more_than_large_alpha() -> None:
    def mean_tv_distance(alpha: float) -> float:
        fd = federated_digits(20, alpha=alpha, seed=0)
        glob = np.bincount(np.concatenate([c.y for c in fd.clients]), minlength=10)
        glob = glob / glob.sum()
        return float(
            np.mean(
                [0.5 * np.abs(c.label_counts() / c.num_samples - glob).sum() for c in fd.clients]
            )
        )

    skewed, iid = mean_tv_distance(0.1), mean_tv_distance(1000.0)
    assert skewed > 0.5  # most of a client's mass sits on few classes
    assert iid < 0.2
    assert skewed > 3 * iid


def test_test_set_is_stratified_over_all_ten_classes() -> None:
    fd = federated_digits(5, seed=0, test_fraction=0.2)
    counts = np.bincount(fd.test_y, minlength=10)
    assert counts.min() >= 30 and len(fd.test_y) == pytest.approx(0.2 * 1797, abs=10)
    assert fd.test_x.shape[1:] == (1, 8, 8) and fd.test_x.dtype == np.float32
    assert fd.test_x.min() >= 0.0 and fd.test_x.max() <= 1.0


def test_partition_refuses_impossible_requests() -> None:
    rng = np.random.default_rng(0)
    y = np.arange(10) % 3
    with pytest.raises(ValueError):
        dirichlet_partition(y, 11, 0.5, rng)
    with pytest.raises(ValueError):
        dirichlet_partition(y, 2, 0.0, rng)
    parts = dirichlet_partition(y, 10, 0.5, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))

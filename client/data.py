"""Federated split of scikit-learn's digits (bundled with the package, no download).

1797 images of 8x8 pixels, 10 classes. A stratified, seeded held-out test set is taken first;
the rest is split across clients with a Dirichlet(alpha) label distribution per class (small
alpha = strong label skew). Every training sample goes to exactly one client and every client
gets at least ``min_samples`` samples. Pure numpy: no torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NUM_CLASSES = 10
IMAGE_SHAPE = (1, 8, 8)


@dataclass(frozen=True)
class ClientData:
    """One client's local data: images ``x`` (n, 1, 8, 8) float32 in [0, 1], labels ``y`` int64."""

    client_id: str
    x: np.ndarray
    y: np.ndarray
    indices: np.ndarray  # rows of the full digits array, for provenance and tests

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def label_counts(self) -> np.ndarray:
        """Samples per class, shape (10,)."""
        return np.bincount(self.y, minlength=NUM_CLASSES)


@dataclass(frozen=True)
class FederatedDigits:
    """The clients' shards plus the held-out test set."""

    clients: list[ClientData]
    test_x: np.ndarray
    test_y: np.ndarray
    test_indices: np.ndarray
    alpha: float
    seed: int

    def client(self, client_id: str) -> ClientData:
        for c in self.clients:
            if c.client_id == client_id:
                return c
        raise KeyError(client_id)


def client_ids(num_clients: int, prefix: str = "client") -> list[str]:
    """Stable client names: ``client-000``, ``client-001``, ..."""
    return [f"{prefix}-{i:03d}" for i in range(num_clients)]


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as ``(x float32 (n,1,8,8) in [0,1], y int64)``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).reshape(-1, *IMAGE_SHAPE)
    y = np.asarray(bunch.target, dtype=np.int64)
    return x, y


def stratified_test_split(
    y: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)``: ``test_fraction`` of every class goes to the test set."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for k in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == k))
        n_test = max(1, round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def dirichlet_partition(
    y: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_samples: int = 1,
) -> list[np.ndarray]:
    """Split positions ``0..len(y)-1`` across clients with Dirichlet(alpha) label skew.

    For every class, proportions over clients are drawn from Dirichlet(alpha) and that class's
    samples are cut accordingly. Clients left with fewer than ``min_samples`` take samples from
    the largest client (one at a time, from its most frequent class), so the result is still a
    partition. Returns one sorted index array per client.
    """
    if num_clients < 1:
        raise ValueError("num_clients must be >= 1")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if len(y) < num_clients * min_samples:
        raise ValueError(
            f"{len(y)} samples cannot give {num_clients} clients {min_samples} samples each"
        )
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for k in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == k))
        props = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for c, chunk in enumerate(np.split(idx, cuts)):
            parts[c].extend(int(i) for i in chunk)
    # Top up starved clients from the largest one, deterministically.
    while True:
        sizes = [len(p) for p in parts]
        poor = [c for c, s in enumerate(sizes) if s < min_samples]
        if not poor:
            break
        rich = int(np.argmax(sizes))
        labels = y[parts[rich]]
        common = int(np.bincount(labels).argmax())
        pos = next(i for i, v in enumerate(parts[rich]) if y[v] == common)
        parts[poor[0]].append(parts[rich].pop(pos))
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def federated_digits(
    num_clients: int,
    alpha: float = 0.5,
    seed: int = 0,
    test_fraction: float = 0.2,
    min_samples: int = 8,
    prefix: str = "client",
) -> FederatedDigits:
    """Digits split non-IID across ``num_clients`` clients, plus a held-out test set.

    Parameters
    ----------
    num_clients : number of clients (each gets a non-empty shard).
    alpha : Dirichlet concentration; 0.1 is very skewed, 100 is close to IID.
    seed : the same seed gives the same split, bit for bit.
    test_fraction : stratified share of every class kept for the test set.
    min_samples : smallest shard size.
    """
    x, y = load_digits_arrays()
    rng = np.random.default_rng(seed)
    train_idx, test_idx = stratified_test_split(y, test_fraction, rng)
    parts = dirichlet_partition(y[train_idx], num_clients, alpha, rng, min_samples)
    clients = []
    for cid, pos in zip(client_ids(num_clients, prefix), parts, strict=True):
        rows = train_idx[pos]
        clients.append(ClientData(cid, x[rows], y[rows], rows))
    return FederatedDigits(clients, x[test_idx], y[test_idx], test_idx, alpha, seed)

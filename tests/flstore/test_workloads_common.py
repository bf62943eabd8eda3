"""Shared builders for the workload tests: a real tiny federated run on scikit-learn digits.

Construction (stated once, used by several tests):
- model: ``nn.Linear(64, 10)`` (650 parameters), softmax regression on digits scaled to [0, 1];
- validation set: 300 held-out digits; the rest is split across clients (IID, or label-skewed
  with two dominant classes per client for the FoolsGold tests);
- a client trains ``steps`` full-batch SGD steps (lr 0.5) from the round's global model;
- label flipping: the client trains on labels ``9 - y``;
- sign flipping: the client sends ``g - (w_honest - g)``, its honest update negated;
- the global after a round is the FedAvg (weights ``n_i``) of the clients' weights, in float64,
  stored as float32.
Every stored vector is made read-only, to prove that the workloads never write their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch
from numpy.typing import NDArray
from sklearn.datasets import load_digits

from flstore_workloads import TorchEvaluator, WorkloadData, flatten_module, load_flat

Vec = NDArray[np.float32]


def frozen(x: NDArray[np.floating]) -> Vec:
    """A read-only float32 copy."""
    y = np.array(x, dtype=np.float32, copy=True)
    y.setflags(write=False)
    return y


@cache
def digits() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)


def validation() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    x, y = digits()
    return x[:300], y[:300]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(64, 10)


def evaluator() -> TorchEvaluator:
    x, y = validation()
    return TorchEvaluator(model(), x, y)


def iid_split(n_clients: int) -> list[tuple[NDArray[np.float32], NDArray[np.int64]]]:
    x, y = digits()
    x, y = x[300:], y[300:]
    return [(x[i::n_clients], y[i::n_clients]) for i in range(n_clients)]


def skewed_split(
    n_clients: int, seed: int = 1
) -> list[tuple[NDArray[np.float32], NDArray[np.int64]]]:
    """Client ``i`` mostly holds class ``i`` (120 samples), plus 30 random samples (``n <= 10``)."""
    x, y = digits()
    x, y = x[300:], y[300:]
    rng = np.random.default_rng(seed)
    parts = []
    for i in range(n_clients):
        main = np.flatnonzero(y == i)
        main = rng.choice(main, size=min(120, len(main)), replace=False)
        extra = rng.choice(len(y), size=30, replace=False)
        idx = np.concatenate([main, extra])
        parts.append((x[idx], y[idx]))
    return parts


def train(global_vec: Vec, x: NDArray[np.float32], y: NDArray[np.int64], steps: int = 20) -> Vec:
    net = model()
    load_flat(net, global_vec)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return flatten_module(net)


@dataclass
class Federation:
    """A small FL run: updates (client weights), globals, metadata, in WorkloadData's layout."""

    data: list[tuple[NDArray[np.float32], NDArray[np.int64]]]
    names: list[str]
    label_flip: set[str] = field(default_factory=set)
    sign_flip: set[str] = field(default_factory=set)
    updates: dict[int, dict[str, Vec]] = field(default_factory=dict)
    globals: dict[int, Vec] = field(default_factory=dict)
    client_meta: dict[int, dict[str, dict[str, object]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.globals:
            self.globals[0] = frozen(flatten_module(model()))

    def run_round(self, r: int, participants: Sequence[str] | None = None) -> None:
        g = self.globals[r - 1]
        ups: dict[str, Vec] = {}
        meta: dict[str, dict[str, object]] = {}
        for name in participants or self.names:
            x, y = self.data[self.names.index(name)]
            w = train(g, x, 9 - y if name in self.label_flip else y)
            if name in self.sign_flip:
                w = g - (w - g)
            ups[name] = frozen(w)
            meta[name] = {"n_samples": len(y), "loss": 1.0, "duration_s": 1.0}
        n = np.array([float(meta[c]["n_samples"]) for c in ups])
        stacked = np.stack([ups[c].astype(np.float64) for c in ups])
        self.globals[r] = frozen(n @ stacked / n.sum())
        self.updates[r] = ups
        self.client_meta[r] = meta

    def workload_data(self, with_evaluator: bool = False) -> WorkloadData:
        return WorkloadData(
            updates=self.updates,
            globals=self.globals,
            client_meta=self.client_meta,
            evaluator=evaluator() if with_evaluator else None,
        )


def names(n: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n)]


@cache
def attacked_round() -> Federation:
    """One round, 10 IID clients: c08 flips labels, c09 flips its update's sign."""
    fed = Federation(iid_split(10), names(10), label_flip={"c08"}, sign_flip={"c09"})
    fed.run_round(1)
    return fed


@cache
def sybil_run() -> Federation:
    """Three rounds: 6 label-skewed honest clients, 2 label-flip and 2 sign-flip sybils (IID data)."""
    iid = iid_split(10)
    data = skewed_split(6) + [iid[6], iid[7], iid[8], iid[9]]
    fed = Federation(
        data,
        names(6, "h") + ["lf0", "lf1", "sf0", "sf1"],
        label_flip={"lf0", "lf1"},
        sign_flip={"sf0", "sf1"},
    )
    for r in (1, 2, 3):
        fed.run_round(r)
    return fed


@cache
def small_round() -> Federation:
    """One round of 5 IID clients where c04 is an exact copy of c03 (same data, same weights)."""
    split = iid_split(4)
    fed = Federation(split + [split[3]], names(5))
    fed.run_round(1)
    return fed


@cache
def three_rounds() -> Federation:
    """Three rounds, 6 clients with unequal sample counts; c05 skips round 2."""
    x, y = digits()
    x, y = x[300:], y[300:]
    sizes = [60, 90, 120, 150, 200, 250]
    bounds = np.cumsum([0, *sizes])
    data = [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    fed = Federation(data, names(6))
    fed.run_round(1)
    fed.run_round(2, participants=names(5))
    fed.run_round(3)
    return fed


def head_heavy_round(
    n: int, d: int, *, head: int = 650, spread: float = 0.1, seed: int = 0
) -> tuple[Vec, list[Vec]]:
    """``(g, [w_i])``: a round like ``bench/flstore_rounds``' at a shorter length, read-only
    float32. The updates ``w_i - g`` are near-parallel (pairwise cosines ~0.97-0.997 at the
    default ``spread``) and carry nearly all their norm in the first ``head`` coordinates (a
    classifier head, ~0.05 a coordinate); the other coordinates are a small shared step plus
    noise (1e-3 in norm) over a large ``g`` (~0.1 a coordinate). The clients differ in how far
    they are from the shared head step, so FoolsGold's weights spread over (0, 1)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(0, 0.1, d).astype(np.float32)
    common = rng.normal(0, 0.05, head)
    tail = rng.normal(0, 1, d - head)
    tail *= 1e-3 / np.linalg.norm(tail)
    tail32 = tail.astype(np.float32)
    noise = np.float32(1e-3 / np.sqrt(d))
    ws = []
    for _ in range(n):
        w = g.copy()
        own = rng.normal(0, 0.05 * spread * (0.5 + rng.random()), head)
        w[:head] += (common + own).astype(np.float32)
        w[head:] += tail32 + noise * rng.standard_normal(d - head, dtype=np.float32)
        w.setflags(write=False)
        ws.append(w)
    g.setflags(write=False)
    return g, ws

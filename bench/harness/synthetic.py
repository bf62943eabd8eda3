"""Synthetic FL histories written to a cold store (tests, benchmarks, demos).

Each round: ``per_round`` clients drawn from a pool; honest clients move the global model along a
shared direction plus noise; optional sign-flipping clients send the opposite update. The global
model of a round is the exact FedAvg (sample-weighted) of its updates, so provenance shares and
aggregates are checkable. Metadata carries what the scheduling and tracking workloads read.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cache_engine.cold_store import ColdStore

SMALL_CNN: dict[str, tuple[int, ...]] = {
    "conv1.weight": (16, 1, 3, 3),
    "conv1.bias": (16,),
    "conv2.weight": (32, 16, 3, 3),
    "conv2.bias": (32,),
    "fc.weight": (10, 32 * 7 * 7),
    "fc.bias": (10,),
}


def resnet18_like(parts: int = 4) -> dict[str, tuple[int, ...]]:
    """Tensors totalling ResNet-18 with 10 classes (11,181,642 floats, 44.7 MB)."""
    total = 11_181_642
    each = total // parts
    shapes: dict[str, tuple[int, ...]] = {f"layer{i}.weight": (each,) for i in range(parts - 1)}
    shapes[f"layer{parts - 1}.weight"] = (total - each * (parts - 1),)
    return shapes


@dataclass
class History:
    """What was written: clients per round and the flat vectors (sorted-name order)."""

    job: str
    clients: dict[int, list[str]] = field(default_factory=dict)
    globals: dict[int, NDArray[np.float32]] = field(default_factory=dict)
    updates: dict[int, dict[str, NDArray[np.float32]]] = field(default_factory=dict)
    n_samples: dict[int, dict[str, float]] = field(default_factory=dict)
    malicious: set[str] = field(default_factory=set)


def _split(
    flat: NDArray[np.float32], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, NDArray[np.float32]]:
    out, off = {}, 0
    for name in sorted(shapes):
        n = int(np.prod(shapes[name]))
        out[name] = flat[off : off + n].reshape(shapes[name])
        off += n
    return out


def write_history(
    cold: ColdStore,
    job: str,
    rounds: int,
    per_round: int = 10,
    pool: int = 250,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    malicious: Sequence[str] = (),
    seed: int = 0,
    keep: bool = True,
    first_round: int = 1,
    noise: float = 0.03,
) -> History:
    """Write rounds ``first_round..first_round+rounds-1`` (and round 0, the initial model)."""
    shapes = dict(shapes or SMALL_CNN)
    d = sum(int(np.prod(s)) for s in shapes.values())
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    names = [f"c{i:03d}" for i in range(pool)]
    h = History(job, malicious=set(malicious))
    g = rng.normal(0, 0.1, d).astype(np.float32)
    if first_round == 1:
        cold.write_round(job, 0, {}, _split(g, shapes), {}, {"lr": 0.1, "note": "initial"})
    if keep:
        h.globals[0] = g.copy()
    direction = rng.normal(0, 1, d).astype(np.float32)
    direction /= np.linalg.norm(direction)
    for r in range(first_round, first_round + rounds):
        chosen = sorted(pick.sample(names, per_round))
        forced = [m for m in malicious if m not in chosen]
        if forced:
            chosen = sorted(set(chosen[: per_round - len(forced)]) | set(forced))
        ups: dict[str, NDArray[np.float32]] = {}
        meta: dict[str, dict[str, Any]] = {}
        acc = np.zeros(d, np.float64)
        total = 0
        for c in chosen:
            step = 0.05 * direction + rng.normal(0, noise / np.sqrt(d), d).astype(np.float32)
            if c in malicious:
                step = -step
            w = (g + step).astype(np.float32)
            n = int(rng.integers(50, 500))
            ups[c] = w
            acc += n * w
            total += n
            loss = float(abs(rng.normal(1.0 / (1 + 0.05 * r), 0.05)))
            meta[c] = {
                "n_samples": n,
                "loss": loss,
                "loss_sq_mean": loss * loss * 1.1,
                "duration_s": float(rng.lognormal(1.0, 0.6)),
                "lr": 0.1,
                "batch_size": 32,
                "epochs": 1,
            }
        g = (acc / total).astype(np.float32)
        cold.write_round(
            job,
            r,
            {c: _split(w, shapes) for c, w in ups.items()},
            _split(g, shapes),
            meta,
            {
                "lr": 0.1,
                "batch_size": 32,
                "epochs": 1,
                "selected": chosen,
                "loss": float(np.mean([m["loss"] for m in meta.values()])),
                "accuracy": float(min(0.99, 0.3 + 0.01 * r)),
                "duration_s": float(max(m["duration_s"] for m in meta.values())),
            },
        )
        h.clients[r] = chosen
        h.n_samples[r] = {c: meta[c]["n_samples"] for c in chosen}
        if keep:
            h.updates[r] = ups
            h.globals[r] = g.copy()
    return h


def write_digits_history(
    cold: ColdStore,
    job: str,
    rounds: int,
    per_round: int = 10,
    pool: int = 50,
    flip: Sequence[str] = (),
    seed: int = 0,
    lr: float = 0.5,
    epochs: int = 1,
) -> History:
    """A real FL job: softmax regression on ``load_digits``, trained by numpy clients.

    Clients hold IID shards of the training split and run ``epochs`` of minibatch SGD from the
    global model; clients in ``flip`` train on flipped labels (``9 - y``). Round 0's metadata
    names the ``digits-softmax`` evaluator (the held-out split) for contribution workloads.
    """
    import time as _time

    from cache_engine.evaluators import digits_split

    xt, yt, xv, yv = digits_split(seed)
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    names = [f"c{i:03d}" for i in range(pool)]
    shards = np.array_split(rng.permutation(len(yt)), pool)
    h = History(job, malicious=set(flip))
    w = np.zeros((10, 64), np.float32)
    b = np.zeros(10, np.float32)

    def flat(b_: NDArray[np.float32], w_: NDArray[np.float32]) -> NDArray[np.float32]:
        return np.concatenate([b_.ravel(), w_.ravel()]).astype(np.float32)

    def acc(b_: NDArray[np.float32], w_: NDArray[np.float32]) -> float:
        return float(np.mean(np.argmax(xv @ w_.T + b_, axis=1) == yv))

    cold.write_round(
        job,
        0,
        {},
        {"bias": b, "weight": w},
        {},
        {
            "evaluator": {"kind": "digits-softmax", "split_seed": seed},
            "lr": lr,
            "epochs": epochs,
            "accuracy": acc(b, w),
        },
    )
    h.globals[0] = flat(b, w)
    for r in range(1, rounds + 1):
        chosen = sorted(set(pick.sample(names, per_round - len(flip))) | set(flip))
        ups, meta = {}, {}
        acc_w, acc_b, total = np.zeros_like(w, np.float64), np.zeros_like(b, np.float64), 0
        for c in chosen:
            t0 = _time.perf_counter()
            idx = shards[names.index(c)]
            x, y = xt[idx], yt[idx]
            if c in flip:
                y = 9 - y
            cw, cb = w.copy(), b.copy()
            losses = []
            for _ in range(epochs):
                for bi in np.array_split(rng.permutation(len(y)), max(1, len(y) // 8)):
                    z = x[bi] @ cw.T + cb
                    z -= z.max(axis=1, keepdims=True)
                    p = np.exp(z)
                    p /= p.sum(axis=1, keepdims=True)
                    losses.append(float(-np.mean(np.log(p[np.arange(len(bi)), y[bi]] + 1e-12))))
                    p[np.arange(len(bi)), y[bi]] -= 1
                    cw -= lr * (p.T @ x[bi]) / len(bi)
                    cb -= lr * p.mean(axis=0)
            n = len(y)
            ups[c] = {"bias": cb.astype(np.float32), "weight": cw.astype(np.float32)}
            acc_w += n * cw
            acc_b += n * cb
            total += n
            loss = float(np.mean(losses))
            meta[c] = {
                "n_samples": n,
                "loss": loss,
                "loss_sq_mean": float(np.mean(np.square(losses))),
                "duration_s": _time.perf_counter() - t0 + 0.5,
                "lr": lr,
                "batch_size": 8,
                "epochs": epochs,
            }
        w = (acc_w / total).astype(np.float32)
        b = (acc_b / total).astype(np.float32)
        cold.write_round(
            job,
            r,
            ups,
            {"bias": b, "weight": w},
            meta,
            {
                "lr": lr,
                "batch_size": 8,
                "epochs": epochs,
                "selected": chosen,
                "loss": float(np.mean([m["loss"] for m in meta.values()])),
                "accuracy": acc(b, w),
                "duration_s": max(m["duration_s"] for m in meta.values()),
            },
        )
        h.clients[r] = chosen
        h.n_samples[r] = {c: meta[c]["n_samples"] for c in chosen}
        h.updates[r] = {c: flat(u["bias"], u["weight"]) for c, u in ups.items()}
        h.globals[r] = flat(b, w)
    return h

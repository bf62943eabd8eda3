"""Clustering of client updates (k-means on ``Delta_i``, silhouette) and personalization.

k-means only depends on inner products, so it runs on an exact ``n x n`` embedding of the Gram
matrix of the updates (:func:`._linalg.embed`) instead of the ``n x d`` updates themselves: same
clusters, same inertia, same silhouettes, one streaming pass over the data.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import Field, model_validator
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_samples

from ._linalg import Row, cosines, embed
from .base import RoundScope, invalid, round_requirements
from .data import Requirements, WorkloadData


def kmeans(
    points: NDArray[np.float64], k: int, *, seed: int = 0, n_init: int = 10
) -> tuple[NDArray[np.int64], float]:
    """Seeded k-means++ (scikit-learn); labels renumbered by first appearance, and the inertia."""
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(points)
    raw = np.asarray(km.labels_)
    _, first = np.unique(raw, return_index=True)
    remap = {int(raw[i]): rank for rank, i in enumerate(sorted(first))}
    return np.array([remap[int(x)] for x in raw], dtype=np.int64), float(km.inertia_)


def silhouettes(
    points: NDArray[np.float64], labels: NDArray[np.int64]
) -> NDArray[np.float64] | None:
    """Per-point silhouette, or ``None`` when undefined (one cluster, or one point per cluster)."""
    k = len(np.unique(labels))
    if k < 2 or k > len(labels) - 1:
        return None
    return np.asarray(silhouette_samples(points, labels), dtype=np.float64)


class KMeansParams(RoundScope):
    k: int | None = Field(
        default=None, ge=1, description="clusters; best silhouette in 2..max_k if omitted"
    )
    max_k: int = Field(default=8, ge=2, description="largest k tried when k is omitted")
    seed: int = Field(default=0, description="k-means++ seed")
    n_init: int = Field(default=10, ge=1, le=100, description="k-means restarts")


def kmeans_requirements(p: KMeansParams) -> Requirements:
    return round_requirements(p)


def _embedding(data: WorkloadData, r: int, clients: list[str]) -> NDArray[np.float64]:
    return embed(data.gram([data.delta(r, c) for c in clients]))


def run_kmeans(data: WorkloadData, p: KMeansParams) -> dict[str, Any]:
    clients = data.select(p.round, p.clients)
    n = len(clients)
    if p.k is not None and p.k > n:
        raise invalid("kmeans", "k", f"must be <= number of clients ({n})", p.k)
    if p.k is None and n < 3:
        raise invalid(
            "kmeans", "k", f"choosing k by silhouette needs >= 3 clients; got {n}: give k"
        )
    x = _embedding(data, p.round, clients)
    tried: dict[int, float | None] = {}
    if p.k is not None:
        k = p.k
        labels, inertia = kmeans(x, k, seed=p.seed, n_init=p.n_init)
    else:
        best: tuple[float, int, NDArray[np.int64], float] | None = None
        for kk in range(2, min(p.max_k, n - 1) + 1):
            lab, ine = kmeans(x, kk, seed=p.seed, n_init=p.n_init)
            s = silhouettes(x, lab)
            tried[kk] = None if s is None else float(s.mean())
            if s is not None and (best is None or float(s.mean()) > best[0]):
                best = (float(s.mean()), kk, lab, ine)
        if best is None:
            raise invalid("kmeans", "k", "no k in 2..max_k gives a defined silhouette: give k")
        _, k, labels, inertia = best
    sil = silhouettes(x, labels)
    return {
        "round": p.round,
        "k": k,
        "labels": {c: int(lab) for c, lab in zip(clients, labels, strict=True)},
        "clusters": [
            [c for c, lab in zip(clients, labels, strict=True) if lab == j] for j in range(k)
        ],
        "inertia": inertia,
        "silhouette": None if sil is None else float(sil.mean()),
        "silhouette_per_client": None
        if sil is None
        else {c: float(s) for c, s in zip(clients, sil, strict=True)},
        "silhouette_by_k": {str(kk): v for kk, v in tried.items()} or None,
    }


class PersonalizeParams(RoundScope):
    client: str = Field(description="client to personalise for")
    method: Literal["similarity", "cluster"] = Field(
        default="similarity", description="how peers are chosen"
    )
    top_k: int = Field(
        default=5, ge=1, description="similarity: peers kept (the client itself included)"
    )
    k: int = Field(default=2, ge=1, description="cluster: number of clusters")
    seed: int = Field(default=0, description="cluster: k-means seed")
    alpha: float | None = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="weight of the peer mixture against the new global g_r; chosen on the evaluator if null",
    )
    alpha_grid: list[float] = Field(default=[0.0, 0.25, 0.5, 0.75, 1.0], min_length=1)

    @model_validator(mode="after")
    def _grid(self) -> PersonalizeParams:
        if any(not 0.0 <= a <= 1.0 for a in self.alpha_grid):
            raise ValueError("alpha_grid values must lie in [0, 1]")
        return self


def personalize_requirements(p: PersonalizeParams) -> Requirements:
    base = round_requirements(p, evaluator=p.alpha is None)
    globals_ = (p.round - 1,) if p.alpha == 1.0 else (p.round - 1, p.round)
    return Requirements(
        policy="P2",
        update_rounds=base.update_rounds,
        clients=base.clients,
        global_versions=globals_,
        client_meta_rounds=(p.round,),
        evaluator=base.evaluator,
    )


def personalization_mixture(data: WorkloadData, p: PersonalizeParams) -> dict[str, Any]:
    """Peer coefficients (sum to 1) over client models for ``p.client``, and the peer similarity."""
    clients = data.select(p.round, p.clients)
    if p.client not in clients:
        raise invalid("personalize", "client", f"not among the round's clients {clients}", p.client)
    me = clients.index(p.client)
    n = data.weights_of(p.round, clients, "samples")
    g = data.gram([data.delta(p.round, c) for c in clients])
    sim = cosines(g)[me]
    if p.method == "similarity":
        order = np.argsort(-sim, kind="stable")
        order = np.concatenate(([me], [i for i in order if i != me]))[: p.top_k]
        w = np.zeros(len(clients))
        w[order] = n[order] * np.maximum(sim[order], 0.0)
    else:
        if p.k > len(clients):
            raise invalid("personalize", "k", f"must be <= number of clients ({len(clients)})", p.k)
        labels, _ = kmeans(embed(g), p.k, seed=p.seed)
        w = np.where(labels == labels[me], n, 0.0)
    w = w / w.sum()
    return {
        "peers": {clients[i]: float(w[i]) for i in np.flatnonzero(w)},
        "similarity": {c: float(s) for c, s in zip(clients, sim, strict=True)},
    }


def _model_row(data: WorkloadData, r: int, peers: dict[str, float], alpha: float) -> Row:
    row: list[tuple[float, Any]] = []
    for c, coef in peers.items():
        row.extend((alpha * coef * a, x) for a, x in data.weights(r, c))
    if alpha < 1.0:
        row.append((1.0 - alpha, data.global_model(r)))
    return row


def personalized_model(
    data: WorkloadData, p: PersonalizeParams, alpha: float | None = None
) -> NDArray[np.float32]:
    """Materialise ``alpha * sum_j c_j w_j + (1 - alpha) g_r`` as a flat float32 vector."""
    mix = personalization_mixture(data, p)
    a = alpha if alpha is not None else (p.alpha if p.alpha is not None else 1.0)
    return data.combine(_model_row(data, p.round, mix["peers"], a))


def run_personalize(data: WorkloadData, p: PersonalizeParams) -> dict[str, Any]:
    mix = personalization_mixture(data, p)
    utilities: dict[str, float] | None = None
    alpha = p.alpha
    if alpha is None:
        ev = data.require_evaluator()
        models = data.combine_many(
            [_model_row(data, p.round, mix["peers"], a) for a in p.alpha_grid]
        )
        utilities = {str(a): float(ev(m)) for a, m in zip(p.alpha_grid, models, strict=True)}
        alpha = max(p.alpha_grid, key=lambda a: (utilities[str(a)], a))
    return {
        "round": p.round,
        "client": p.client,
        "method": p.method,
        "alpha": alpha,
        "coefficients": {c: alpha * w for c, w in mix["peers"].items()},
        "global": {"version": p.round, "coefficient": 1.0 - alpha},
        "similarity": mix["similarity"],
        "utility_by_alpha": utilities,
    }

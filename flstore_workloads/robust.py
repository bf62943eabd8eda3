"""Malicious-client filtering: cosine to the aggregate, Multi-Krum, FoolsGold.

Pure functions over Gram/cosine matrices (tested against brute force), and the workload glue that
builds those matrices from a round's updates ``Delta_i = w_i - g_{r-1}`` in one streaming pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from core.robust import krum_scores

from ._linalg import cosines, distances
from .base import RoundParams, RoundRange, RoundScope, invalid, round_requirements
from .data import Requirements, WorkloadData

# -- pure math -----------------------------------------------------------------------------------


def cosine_to_aggregate(g: NDArray[np.float64], p: NDArray[np.float64]) -> NDArray[np.float64]:
    """``cos(Delta_i, a)`` with ``a = sum_j p_j Delta_j``, from the Gram matrix of the ``Delta_i``."""
    gp = g @ p
    a_norm2 = float(p @ gp)
    norms = np.sqrt(np.maximum(np.diag(g), 0.0))
    denom = norms * np.sqrt(max(a_norm2, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(denom > 0, gp / np.where(denom > 0, denom, 1.0), 0.0)
    return np.asarray(np.clip(s, -1.0, 1.0), dtype=np.float64)


def foolsgold_weights(cs: NDArray[np.float64]) -> NDArray[np.float64]:
    """FoolsGold learning-rate weights from the cosine matrix of historical updates.

    Steps (workloads.md): zero the diagonal; ``v_i = max_j cs_ij``; pardon
    ``cs_ij *= v_i / v_j`` where ``v_j > v_i``; ``alpha_i = 1 - max_j cs_ij`` clipped to [0, 1]
    and divided by its max; logit ``ln(alpha / (1 - alpha)) + 0.5`` clipped to [0, 1]
    (``alpha = 1`` is taken as 0.99 first, as the reference code does).
    """
    n = cs.shape[0]
    c = cs - np.diag(np.diag(cs))  # the reference subtracts the identity: self-similarity is 0
    v = c.max(axis=1)
    pardon = v[None, :] > v[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(pardon, v[:, None] / np.where(pardon, v[None, :], 1.0), 1.0)
    c = c * ratio
    alpha = np.clip(1.0 - c.max(axis=1), 0.0, 1.0)
    top = alpha.max() if n else 0.0
    if top <= 0:
        return np.zeros(n)
    alpha = alpha / top
    alpha = np.where(alpha >= 1.0, 0.99, alpha)
    with np.errstate(divide="ignore"):
        logit = np.log(alpha / (1.0 - alpha)) + 0.5
    logit = np.where(np.isneginf(logit), 0.0, logit)
    return np.asarray(np.clip(logit, 0.0, 1.0), dtype=np.float64)


# -- workloads -----------------------------------------------------------------------------------


class CosineParams(RoundParams):
    bottom_k: int = Field(
        default=1, ge=0, description="flag the k clients least aligned with the aggregate"
    )
    threshold: float | None = Field(
        default=None, ge=-1.0, le=1.0, description="also flag every client with cosine below this"
    )


def run_cosine(data: WorkloadData, p: CosineParams) -> dict[str, Any]:
    clients = data.select(p.round, p.clients)
    if p.bottom_k > len(clients):
        raise invalid(
            "cosine-to-aggregate",
            "bottom_k",
            f"must be <= number of clients ({len(clients)})",
            p.bottom_k,
        )
    w = data.weights_of(p.round, clients, p.weighting)
    s = cosine_to_aggregate(data.gram([data.delta(p.round, c) for c in clients]), w)
    order = np.argsort(s, kind="stable")
    flagged = {clients[i] for i in order[: p.bottom_k]}
    if p.threshold is not None:
        flagged |= {c for c, v in zip(clients, s, strict=True) if v < p.threshold}
    return {
        "round": p.round,
        "cosine": {c: float(v) for c, v in zip(clients, s, strict=True)},
        "ranking": [clients[i] for i in order],
        "flagged": [clients[i] for i in order if clients[i] in flagged],
    }


class KrumParams(RoundScope):
    f: int = Field(default=1, ge=0, description="number of Byzantine clients tolerated")
    m: int | None = Field(
        default=None, ge=1, description="clients selected (Multi-Krum); n - f when omitted"
    )


def run_krum(data: WorkloadData, p: KrumParams) -> dict[str, Any]:
    clients = data.select(p.round, p.clients)
    n = len(clients)
    if n < p.f + 3:
        raise invalid(
            "multi-krum", "f", f"Krum needs n >= f + 3 clients; this round has n={n}", p.f
        )
    m = n - p.f if p.m is None else p.m
    if m > n:
        raise invalid("multi-krum", "m", f"must be <= number of clients ({n})", p.m)
    d2 = distances(data.gram([data.delta(p.round, c) for c in clients]))
    scores = krum_scores(d2, p.f)
    order = np.argsort(scores, kind="stable")
    selected = [clients[i] for i in order[:m]]
    return {
        "round": p.round,
        "f": p.f,
        "m": m,
        "scores": {c: float(v) for c, v in zip(clients, scores, strict=True)},
        "krum": clients[int(order[0])],
        "selected": selected,
        "flagged": [clients[i] for i in order[m:]],
    }


class FoolsGoldParams(RoundRange):
    """A history window of rounds: the clients' updates over it are compared."""

    clients: list[str] | None = Field(
        default=None, min_length=2, description="clients; all seen when omitted"
    )
    flag_below: float = Field(
        default=0.5, ge=0.0, le=1.0, description="flag clients whose weight is below this"
    )


def foolsgold_requirements(p: FoolsGoldParams) -> Requirements:
    rounds = p.rounds
    return Requirements(
        policy="P3",
        update_rounds=rounds,
        clients=None if p.clients is None else tuple(p.clients),
        global_versions=tuple(r - 1 for r in rounds),
    )


def run_foolsgold(data: WorkloadData, p: FoolsGoldParams) -> dict[str, Any]:
    rounds = p.rounds
    present = {r: set(data.round_clients(r)) for r in rounds}
    seen = sorted(set().union(*present.values()))
    clients = p.chosen("foolsgold", p.clients, seen)
    if len(clients) < 2:
        raise invalid(
            "foolsgold", "clients", "FoolsGold compares clients: needs at least 2", clients
        )
    # history_i = sum_t Delta_i^t: Gram of the per-round updates (cached per round by a cache
    # function, so only cross-round products are new), then combined: H = C G C^T
    atoms = [(r, c) for c in clients for r in rounds if c in present[r]]
    comb = np.zeros((len(clients), len(atoms)))
    for j, (_, c) in enumerate(atoms):
        comb[clients.index(c), j] = 1.0
    cs = cosines(comb @ data.gram([data.delta(r, c) for r, c in atoms]) @ comb.T)
    w = foolsgold_weights(cs)
    order = np.argsort(w, kind="stable")
    return {
        "first_round": p.first_round,
        "last_round": p.last_round,
        "weights": {c: float(v) for c, v in zip(clients, w, strict=True)},
        "rounds_seen": {c: sum(c in present[r] for r in rounds) for c in clients},
        "max_similarity": {c: float(np.max(np.delete(cs[i], i))) for i, c in enumerate(clients)},
        "flagged": [clients[i] for i in order if w[i] < p.flag_below],
    }


def cosine_requirements(p: CosineParams) -> Requirements:
    return round_requirements(p)


def krum_requirements(p: KrumParams) -> Requirements:
    return round_requirements(p)

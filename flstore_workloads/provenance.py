"""Provenance: each client's exact share of the global model's change over a range of rounds.

FedAvg is linear: ``g_t - g_{t-1} = sum_i p_i^t Delta_i^t``, so ``g_R - g_{F-1} = sum_i C_i`` with
``C_i = sum_t p_i^t Delta_i^t``, and ``share_i = <C_i, g_R - g_{F-1}> / ||g_R - g_{F-1}||^2`` sums to 1
over all clients (workloads.md (f)). The residual ``||g_R - g_{F-1} - sum_i C_i|| / ||g_R - g_{F-1}||``
says how exactly the stored globals are the FedAvg of the stored updates (0 up to round-off).
``p_i^t`` comes from the metadata of every participant of round ``t`` (``client_meta[t]``), so a
single client's share needs only that client's updates (P3) plus the rounds' small metadata.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from ._linalg import Row
from .base import RoundRange
from .data import Requirements, WorkloadData
from .errors import DataMismatch


class ProvenanceParams(RoundRange):
    clients: list[str] | None = Field(
        default=None, min_length=1, description="clients to trace; all if omitted"
    )
    weighting: Literal["samples", "uniform"] = Field(
        default="samples", description="FedAvg weights used"
    )
    lineage: bool = Field(
        default=False, description="add a (round, client, parent, update hash, n, p) table"
    )


def provenance_requirements(p: ProvenanceParams) -> Requirements:
    rounds = p.rounds
    return Requirements(
        policy="P3",
        update_rounds=rounds,
        clients=None if p.clients is None else tuple(p.clients),
        global_versions=tuple(r - 1 for r in rounds) + (p.last_round,),
        client_meta_rounds=rounds,
    )


def _participants(data: WorkloadData, r: int) -> list[str]:
    meta = data.client_meta.get(r)
    return sorted(meta) if meta else data.round_clients(r)


def run_provenance(data: WorkloadData, p: ProvenanceParams) -> dict[str, Any]:
    rounds = p.rounds
    weights: dict[int, dict[str, float]] = {}
    for r in rounds:
        parts = _participants(data, r)
        w = data.weights_of(r, parts, p.weighting)
        weights[r] = dict(zip(parts, map(float, w), strict=True))
    everyone = sorted({c for r in rounds for c in weights[r]})
    clients = p.chosen("provenance", p.clients, everyone)
    # C_i = sum_t p_i^t Delta_i^t: Gram of the per-round updates and the global change (cached
    # per round by a cache function), combined as C G C^T
    atoms = [(r, c) for c in clients for r in rounds if c in weights[r]]
    start, end = data.global_model(p.first_round - 1), data.global_model(p.last_round)
    rows: list[Row] = [data.delta(r, c) for r, c in atoms] + [[(1.0, end), (-1.0, start)]]
    comb = np.zeros((len(clients) + 1, len(rows)))
    for j, (r, c) in enumerate(atoms):
        comb[clients.index(c), j] = weights[r][c]
    comb[-1, -1] = 1.0
    g = comb @ data.gram(rows) @ comb.T
    change2 = float(g[-1, -1])
    if change2 <= 0.0:
        raise DataMismatch(
            f"the global model did not change between versions {p.first_round - 1} and {p.last_round}: shares undefined"
        )
    shares = g[:-1, -1] / change2
    result: dict[str, Any] = {
        "first_round": p.first_round,
        "last_round": p.last_round,
        "shares": dict(zip(clients, map(float, shares), strict=True)),
        "change_norm": float(np.sqrt(change2)),
        "contribution_norm": {c: float(np.sqrt(max(g[i, i], 0.0))) for i, c in enumerate(clients)},
        "complete": p.clients is None,
        "share_sum": float(shares.sum()),
    }
    if p.clients is None:
        m = len(clients)
        resid2 = change2 - 2.0 * float(g[:m, -1].sum()) + float(g[:m, :m].sum())
        result["residual"] = float(np.sqrt(max(resid2, 0.0)) / np.sqrt(change2))
    if p.lineage:
        result["lineage"] = [
            {
                "round": r,
                "client": c,
                "parent_global": data.digest(data.global_model(r - 1)),
                "update": data.digest(data.update(r, c)),
                "n_samples": data.n_samples(r, c) if p.weighting == "samples" else None,
                "p": weights[r][c],
            }
            for r in rounds
            for c in clients
            if c in weights[r]
        ]
    return result

"""Client scheduling with Oort's utility (Lai et al., OSDI'21; FedScale ``thirdparty/oort``).

Per client, from its latest metadata in the window (P4): statistical utility
``U_i = |B_i| * sqrt(mean per-sample loss^2)``; score
``(min(U_i, clip) - U_min) / range + sqrt(0.1 * ln R / L_i)`` with ``L_i`` the last round the client
was picked; a client slower than the preferred duration ``T`` (a percentile of durations) is
multiplied by ``(T / t_i)^alpha``. Selection: ``(1 - eps) K`` clients sampled in proportion to score
among those scoring at least ``cut_off`` times the ``(1 - eps) K``-th score, the rest explored among
never-seen candidates; ``eps = max(0.9 * 0.98^R, 0.3)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from .base import Params, invalid
from .data import Requirements, WorkloadData
from .errors import MissingData


def statistical_utility(meta: Mapping[str, Any]) -> tuple[float, bool]:
    """``|B| * sqrt(mean loss^2)`` from a client's metadata; second item: True if approximated.

    Uses ``loss_sq_mean`` (mean squared per-sample loss), else a ``losses`` list, else ``loss``
    (mean loss; ``|loss|`` stands in for the root mean square, a lower bound, flagged as approximate).
    """
    n = float(meta["n_samples"])
    if "loss_sq_mean" in meta:
        return n * float(np.sqrt(max(float(meta["loss_sq_mean"]), 0.0))), False
    if "losses" in meta:
        losses = np.asarray(meta["losses"], dtype=np.float64)
        return n * float(np.sqrt(np.mean(losses**2))) if losses.size else 0.0, False
    return n * abs(float(meta["loss"])), True


def oort_scores(
    utility: NDArray[np.float64],
    last_round: NDArray[np.float64],
    duration: NDArray[np.float64],
    current_round: int,
    *,
    deadline: float,
    alpha: float = 2.0,
    clip_bound: float = 0.95,
) -> NDArray[np.float64]:
    """Oort exploitation scores of explored clients (vectorised formula of the module docstring)."""
    if utility.size == 0:
        return np.zeros(0)
    ordered = np.sort(utility)
    clip = ordered[min(int(len(ordered) * clip_bound), len(ordered) - 1)]
    u = np.minimum(utility, clip)
    u_min = float(utility.min())
    rng = max(float(utility.max()) - u_min, 1e-4)
    score = (u - u_min) / rng + np.sqrt(0.1 * np.log(max(current_round, 1)) / last_round)
    slow = duration > deadline
    score = np.where(slow, score * (deadline / np.maximum(duration, 1e-4)) ** alpha, score)
    return np.asarray(np.abs(score), dtype=np.float64)


class OortParams(Params):
    round: int = Field(ge=2, description="round being scheduled; history is the window before it")
    k: int = Field(ge=1, description="number of clients to select")
    window: int = Field(default=10, ge=1, description="rounds of metadata to read (P4's R)")
    candidates: list[str] | None = Field(
        default=None, min_length=1, description="feasible clients; all seen if omitted"
    )
    deadline_percentile: float = Field(
        default=30.0, gt=0.0, le=100.0, description="T as a percentile of durations"
    )
    deadline_s: float | None = Field(
        default=None, gt=0.0, description="explicit T (overrides the percentile)"
    )
    alpha: float = Field(default=2.0, ge=0.0, description="straggler penalty exponent")
    clip_bound: float = Field(
        default=0.95, gt=0.0, le=1.0, description="utility clipped at this quantile"
    )
    cut_off: float = Field(
        default=0.95, gt=0.0, le=1.0, description="sample among scores >= cut_off * K-th"
    )
    exploration: float | None = Field(
        default=None, ge=0.0, le=1.0, description="eps; max(0.9*0.98^R, 0.3) if omitted"
    )
    seed: int = Field(default=0, description="sampling seed")


def oort_requirements(p: OortParams) -> Requirements:
    rounds = tuple(range(max(1, p.round - p.window), p.round))
    return Requirements(policy="P4", client_meta_rounds=rounds)


def _history(data: WorkloadData, p: OortParams) -> dict[str, tuple[int, Mapping[str, Any]]]:
    rounds = range(max(1, p.round - p.window), p.round)
    latest: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for r in rounds:
        for client, meta in data.client_meta.get(r, {}).items():
            latest[client] = (r, meta)
    if not latest:
        raise MissingData("client_meta", round=p.round - 1)
    return latest


def run_oort(data: WorkloadData, p: OortParams) -> dict[str, Any]:
    latest = _history(data, p)
    candidates = sorted(latest) if p.candidates is None else list(dict.fromkeys(p.candidates))
    explored = [c for c in candidates if c in latest]
    unexplored = [c for c in candidates if c not in latest]
    if p.k > len(candidates):
        raise invalid("oort", "k", f"must be <= number of candidates ({len(candidates)})", p.k)
    for c in explored:
        for key in ("n_samples", "duration_s"):
            if key not in latest[c][1]:
                raise MissingData("client_meta", round=latest[c][0], clients=[c], key=key)
    utils = [statistical_utility(latest[c][1]) for c in explored]
    utility = np.array([u for u, _ in utils], dtype=np.float64)
    last = np.array([latest[c][0] for c in explored], dtype=np.float64)
    duration = np.array([float(latest[c][1]["duration_s"]) for c in explored], dtype=np.float64)
    all_durations = np.array([float(m["duration_s"]) for _, m in latest.values()], dtype=np.float64)
    deadline = (
        p.deadline_s
        if p.deadline_s is not None
        else float(
            np.sort(all_durations)[
                min(int(len(all_durations) * p.deadline_percentile / 100.0), len(all_durations) - 1)
            ]
        )
    )
    scores = oort_scores(
        utility, last, duration, p.round, deadline=deadline, alpha=p.alpha, clip_bound=p.clip_bound
    )
    eps = p.exploration if p.exploration is not None else max(0.9 * 0.98**p.round, 0.3)
    rng = np.random.default_rng(p.seed)
    n_exploit = min(int(p.k * (1.0 - eps)), len(explored))
    n_explore = min(p.k - n_exploit, len(unexplored))
    n_exploit = min(p.k - n_explore, len(explored))  # no unexplored left: exploit the rest
    order = np.argsort(-scores, kind="stable")
    exploit: list[str] = []
    if n_exploit > 0:
        kth = scores[order[n_exploit - 1]]
        pool = order[scores[order] >= p.cut_off * kth]
        prob = (
            scores[pool] / max(float(scores[pool].sum()), 1e-12) if scores[pool].sum() > 0 else None
        )
        picked = rng.choice(pool, size=n_exploit, replace=False, p=prob)
        exploit = [explored[i] for i in sorted(picked, key=lambda i: -scores[i])]
    explore = (
        [unexplored[i] for i in rng.choice(len(unexplored), size=n_explore, replace=False)]
        if n_explore
        else []
    )
    return {
        "round": p.round,
        "scores": {c: float(s) for c, s in zip(explored, scores, strict=True)},
        "utility": {c: float(u) for c, u in zip(explored, utility, strict=True)},
        "approximate_utility": sorted(
            c for c, (_, approx) in zip(explored, utils, strict=True) if approx
        ),
        "ranking": [explored[i] for i in order],
        "deadline_s": float(deadline),
        "exploration": float(eps),
        "selected": exploit + explore,
        "exploited": exploit,
        "explored": explore,
    }

"""Contributions and incentives: leave-one-out, Shapley values (exact, GTG, TMC), payouts.

The utility of a coalition ``S`` of a round's clients is ``v(S) = evaluator(g_{r-1} + sum_{i in S}
p_i^S Delta_i)`` with ``p^S`` renormalised over ``S`` (workloads.md); ``v(empty)`` is the utility of
the round's starting model. No retraining: one aggregate per coalition, memoised.

Sub-models are built in batches (:meth:`WorkloadData.combine_many`: on the cache functions that
hold a round in coordinate slices, each builds its slice of every sub-model of the batch) and
evaluated in batches where the evaluator takes several models at once (a ``map`` method: the
job's evaluator function, ``cache_engine.evaluators``). The algorithms ask for the coalitions
they will need together (:meth:`~flstore_workloads.utility.CoalitionUtility.prefetch`): all of them for leave-one-out and
exact Shapley; for GTG, position by position across the permutations of a cycle (those the
truncation rule still runs: the same evaluations as one permutation after the other), or, for
small models and an evaluator function, every prefix of the cycle at once (a request costs more
than evaluating what truncation would skip); for TMC, the next prefixes of a permutation. A coalition larger than half the round is built from the
round's whole aggregate minus the clients left out (leave-one-out: two vectors, not ``n``).
Utilities already evaluated are kept across queries by a holder of the same sealed vectors
(:class:`~flstore_workloads.utility.UtilityCache`). The values, hence the answers, are those of one-by-one evaluation.

An evaluator whose utility depends on a coordinate range of the model alone says so with a
``span`` attribute ``(a, b)`` (``cache_engine.evaluators``: a classifier that leads a longer
model) and is given only those coordinates of each sub-model. Then the range of every vector
of the round is read once (on vectors held in coordinate parts: from the parts it overlaps,
one request) and every sub-model is built from it here, as its coefficients over the round's
vectors times that ``k x (b - a)`` slice (float64, rounded to float32 once, as
:func:`~flstore_workloads._linalg.combine` does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from .base import RoundParams, invalid, round_requirements
from .data import Requirements, WorkloadData
from .utility import CoalitionUtility, prefetch, width

MAX_EXACT = 14


# -- pure algorithms over a utility function v(tuple_of_indices) -----------------------------------
def leave_one_out(v: Callable[[Sequence[int]], float], n: int) -> NDArray[np.float64]:
    """``phi_i = v(N) - v(N \\ {i})``."""
    prefetch(v, [tuple(range(n))] + [tuple(j for j in range(n) if j != i) for i in range(n)])
    full = v(tuple(range(n)))
    return np.array([full - v(tuple(j for j in range(n) if j != i)) for i in range(n)])


def exact_shapley(v: Callable[[Sequence[int]], float], n: int) -> NDArray[np.float64]:
    """Exact Shapley values by enumerating all ``2^n`` coalitions (bitmask-vectorised sum)."""
    masks = np.arange(1 << n)
    prefetch(v, [tuple(i for i in range(n) if m >> i & 1) for m in masks])
    values = np.array([v(tuple(i for i in range(n) if m >> i & 1)) for m in masks])
    sizes = np.array([bin(m).count("1") for m in masks])
    fact = np.array([math.factorial(k) for k in range(n + 1)], dtype=np.float64)
    weight = fact[sizes] * fact[np.maximum(n - sizes - 1, 0)] / fact[n]  # full set never used
    phi = np.empty(n)
    for i in range(n):
        without = masks[(masks >> i & 1) == 0]
        phi[i] = float(np.sum(weight[without] * (values[without | (1 << i)] - values[without])))
    return phi


def _not_converged(
    records: list[NDArray[np.float64]], converge_min: int, last_k: int, tol: float
) -> bool:
    """GTG's stopping rule: mean relative change of the running means over the last ``last_k``."""
    if len(records) <= converge_min:
        return True
    arr = np.asarray(records)
    running = (np.cumsum(arr, axis=0) / np.arange(1, len(arr) + 1)[:, None])[-last_k:]
    errors = np.mean(np.abs(running - running[-1:]) / (np.abs(running[-1:]) + 1e-12), axis=1)
    return bool(np.max(errors) > tol)


def _gtg_cycle(
    v: Callable[[Sequence[int]], float],
    perms: Sequence[NDArray[np.int_]],
    v_empty: float,
    v_full: float,
    eps: float,
) -> tuple[list[NDArray[np.float64]], int]:
    """The marginals of each permutation of a GTG cycle (they do not depend on each other),
    position by position: the prefixes still needed at position ``j`` (those of permutations
    not truncated yet) are asked for together. Same values and truncations as one
    permutation after the other."""
    k = len(perms)
    n = len(perms[0]) if k else 0
    prev = [v_empty] * k
    marginals = np.zeros((k, n))
    truncations = 0
    if getattr(v, "ahead", False):  # small models, evaluated in batches: the whole cycle
        prefetch(v, [tuple(p[: j + 1]) for p in perms for j in range(n)])
    for j in range(n):
        live = [p for p in range(k) if abs(v_full - prev[p]) >= eps]
        prefetch(v, [tuple(perms[p][: j + 1]) for p in live])
        for p in range(k):
            if abs(v_full - prev[p]) >= eps:
                cur = v(tuple(perms[p][: j + 1]))
            else:
                cur = prev[p]
                truncations += 1
            marginals[p, perms[p][j]] = cur - prev[p]
            prev[p] = cur
    return list(marginals), truncations


def permutation_shapley(
    v: Callable[[Sequence[int]], float],
    n: int,
    *,
    guided: bool = True,
    seed: int = 0,
    eps: float = 0.001,
    round_trunc_threshold: float = 0.01,
    converge_min: int | None = None,
    last_k: int = 10,
    converge_criteria: float = 0.05,
    max_permutations: int = 500,
) -> tuple[NDArray[np.float64], dict[str, Any]]:
    """GTG-Shapley (``guided=True``) or TMC-Shapley (``guided=False``) estimates.

    Within-round truncation: when ``|v(N) - v(empty)| <= round_trunc_threshold`` all values are 0.
    Within a permutation, once ``|v(N) - v(prefix)| < eps`` the remaining marginals are 0.
    GTG guides sampling by cycling the first position through the clients, the rest random.
    Stops after more than ``converge_min`` permutations (default ``max(30, n)``) when the running
    means moved by less than ``converge_criteria`` (mean relative change) over the last ``last_k``,
    or after ``max_permutations``; GTG tests this after each cycle of ``n`` permutations, TMC
    after each permutation. Deterministic for a given ``seed``.
    """
    rng = np.random.default_rng(seed)
    prefetch(v, [(), tuple(range(n))])
    batch = width(v)
    v_empty = v(())
    v_full = v(tuple(range(n)))
    info: dict[str, Any] = {"v_empty": v_empty, "v_full": v_full, "permutations": 0}
    if abs(v_full - v_empty) <= round_trunc_threshold:
        # every value is 0, exactly: nothing to converge (the answer has the same keys)
        info.update(round_truncated=True, converged=True, truncated_marginals=0)
        return np.zeros(n), info
    cmin = max(30, n) if converge_min is None else converge_min
    records: list[NDArray[np.float64]] = []
    truncations = 0
    while len(records) < max_permutations and _not_converged(
        records, cmin, last_k, converge_criteria
    ):
        if guided:  # a cycle: the first position through every client, the rest random
            perms = [
                np.concatenate(
                    ([first], rng.permutation([i for i in range(n) if i != first]))
                ).astype(int)
                for first in range(min(n, max_permutations - len(records)))
            ]
            marginals, t = _gtg_cycle(v, perms, v_empty, v_full, eps)
            records += marginals
            truncations += t
            continue
        for _ in range(n):
            if len(records) >= max_permutations:
                break
            perm = rng.permutation(n)
            marginal = np.zeros(n)
            prev = v_empty
            for j in range(n):
                if abs(v_full - prev) >= eps:
                    if batch > 1 and j % batch == 0:  # the next prefixes, evaluated at once
                        prefetch(v, [tuple(perm[: k + 1]) for k in range(j, min(n, j + batch))])
                    cur = v(tuple(perm[: j + 1]))
                else:
                    cur = prev
                    truncations += 1
                marginal[perm[j]] = cur - prev
                prev = cur
            records.append(marginal)
            if not _not_converged(records, cmin, last_k, converge_criteria):
                break
    info.update(permutations=len(records), truncated_marginals=truncations, round_truncated=False)
    info["converged"] = not _not_converged(records, cmin, last_k, converge_criteria)
    return np.asarray(np.mean(records, axis=0), dtype=np.float64), info


# -- workloads ------------------------------------------------------------------------------------


class LooParams(RoundParams):
    pass


class ShapleyParams(RoundParams):
    method: Literal["gtg", "tmc", "exact"] = Field(default="gtg", description="estimator")
    seed: int = Field(default=0, description="permutation sampling seed")
    eps: float = Field(default=0.001, ge=0.0, description="within-permutation truncation tolerance")
    round_trunc_threshold: float = Field(
        default=0.01, ge=0.0, description="skip the round below this gain"
    )
    converge_min: int | None = Field(
        default=None, ge=1, description="min permutations; max(30, n) if omitted"
    )
    last_k: int = Field(default=10, ge=2, description="window of the convergence test")
    converge_criteria: float = Field(
        default=0.05, gt=0.0, description="mean relative change to stop"
    )
    max_permutations: int = Field(
        default=500, ge=1, le=100_000, description="hard cap on permutations"
    )


class IncentiveParams(RoundParams):
    budget: float = Field(gt=0.0, description="tokens to distribute this round")
    contribution: Literal["loo", "gtg", "exact"] = Field(
        default="gtg", description="contribution measure"
    )
    seed: int = Field(default=0, description="seed for GTG sampling")


def _utility(data: WorkloadData, p: RoundParams) -> tuple[list[str], CoalitionUtility]:
    clients = data.select(p.round, p.clients)
    weights = data.weights_of(p.round, clients, p.weighting)
    v = CoalitionUtility(
        data.require_evaluator(),
        [(1.0, data.base(p.round))],
        [data.delta(p.round, c) for c in clients],
        weights,
        combine_many=data.combine_many,
        cache=data.utility_cache,
    )
    return clients, v


def contribution_requirements(p: RoundParams) -> Requirements:
    return round_requirements(p, evaluator=True)


def run_loo(data: WorkloadData, p: LooParams) -> dict[str, Any]:
    clients, v = _utility(data, p)
    phi = leave_one_out(v, len(clients))
    return {
        "round": p.round,
        "values": dict(zip(clients, map(float, phi), strict=True)),
        "v_full": v(tuple(range(len(clients)))),
        "evaluations": v.evaluations,
    }


#: the Shapley parameters that are :func:`permutation_shapley`'s keywords of the same names
PERMUTATION_KNOBS = (
    "seed",
    "eps",
    "round_trunc_threshold",
    "converge_min",
    "last_k",
    "converge_criteria",
    "max_permutations",
)


def shapley_values(
    data: WorkloadData, p: ShapleyParams
) -> tuple[list[str], NDArray[np.float64], dict[str, Any]]:
    """Shapley values of the round's clients by ``p.method``, with run information."""
    clients, v = _utility(data, p)
    n = len(clients)
    if p.method == "exact":
        if n > MAX_EXACT:
            raise invalid(
                "shapley",
                "method",
                f"exact enumerates 2^n coalitions; n={n} > {MAX_EXACT}: use gtg",
                p.method,
            )
        phi = exact_shapley(v, n)
        info: dict[str, Any] = {"v_empty": v(()), "v_full": v(tuple(range(n)))}
    else:
        # the parameters of the estimate are named as permutation_shapley's keywords
        knobs = p.model_dump(include=set(PERMUTATION_KNOBS))
        phi, info = permutation_shapley(v, n, guided=p.method == "gtg", **knobs)
    info["evaluations"] = v.evaluations
    return clients, phi, info


def run_shapley(data: WorkloadData, p: ShapleyParams) -> dict[str, Any]:
    clients, phi, info = shapley_values(data, p)
    return {
        "round": p.round,
        "method": p.method,
        "values": dict(zip(clients, map(float, phi), strict=True)),
        "sum": float(phi.sum()),
        **{k: (float(x) if isinstance(x, float | np.floating) else x) for k, x in info.items()},
    }


def distribute(contributions: NDArray[np.float64], budget: float) -> NDArray[np.float64]:
    """Pay ``budget`` in proportion to the positive part of each contribution (nothing if none)."""
    pos = np.maximum(contributions, 0.0)
    total = pos.sum()
    return budget * pos / total if total > 0 else np.zeros_like(pos)


def run_incentives(data: WorkloadData, p: IncentiveParams) -> dict[str, Any]:
    if p.contribution == "loo":
        clients, v = _utility(data, p)
        phi = leave_one_out(v, len(clients))
    else:
        sp = ShapleyParams(
            round=p.round,
            clients=p.clients,
            weighting=p.weighting,
            method=p.contribution,
            seed=p.seed,
        )
        clients, phi, _ = shapley_values(data, sp)
    pay = distribute(phi, p.budget)
    return {
        "round": p.round,
        "contribution": p.contribution,
        "contributions": dict(zip(clients, map(float, phi), strict=True)),
        "payouts": dict(zip(clients, map(float, pay), strict=True)),
        "paid": float(pay.sum()),
        "budget": p.budget,
    }

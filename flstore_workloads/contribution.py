"""Contributions and incentives: leave-one-out, Shapley values (exact, GTG, TMC), payouts.

The utility of a coalition ``S`` of a round's clients is ``v(S) = evaluator(g_{r-1} + sum_{i in S}
p_i^S Delta_i)`` with ``p^S`` renormalised over ``S`` (workloads.md); ``v(empty)`` is the utility of
the round's starting model. No retraining: one aggregate per coalition, memoised.

Sub-models are built in batches (:meth:`WorkloadData.combine_many`: on the cache functions that
hold a round in coordinate slices, each builds its slice of every sub-model of the batch) and
evaluated in batches where the evaluator takes several models at once (a ``map`` method: the
job's evaluator function, ``cache_engine.evaluators``). The algorithms ask for the coalitions
they will need together (:meth:`CoalitionUtility.prefetch`): all of them for leave-one-out and
exact Shapley; for GTG, position by position across the permutations of a cycle (those the
truncation rule still runs: the same evaluations as one permutation after the other), or, for
small models and an evaluator function, every prefix of the cycle at once (a request costs more
than evaluating what truncation would skip); for TMC, the next prefixes of a permutation. A coalition larger than half the round is built from the
round's whole aggregate minus the clients left out (leave-one-out: two vectors, not ``n``).
Utilities already evaluated are kept across queries by a holder of the same sealed vectors
(:class:`UtilityCache`). The values, hence the answers, are those of one-by-one evaluation.

An evaluator whose utility depends on a coordinate range of the model alone says so with a
``span`` attribute ``(a, b)`` (``cache_engine.evaluators``: a classifier that leads a longer
model) and is given only those coordinates of each sub-model. Then the range of every vector
of the round is read once (on vectors held in coordinate parts: from the parts it overlaps,
one request) and every sub-model is built from it here, as its coefficients over the round's
vectors times that ``k x (b - a)`` slice (float64, rounded to float32 once, as
:func:`~flstore_workloads._linalg.combine` does).
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from ._linalg import Row, combine, merge
from .base import RoundParams, invalid, round_requirements
from .data import Evaluator, Requirements, WorkloadData
from .errors import DataMismatch

MAX_EXACT = 14
#: sub-models built at once (their bytes): two ResNet-18-sized models, a cycle of 20 small ones
BATCH_BYTES = 128 << 20
#: below this many clients every coalition is summed directly (the aggregate costs more)
COMPLEMENT_MIN = 8


class UtilityCache:
    """Utilities of sub-models already evaluated, kept across queries.

    A cache function answers many contribution queries on the same round (leave-one-out,
    Shapley, incentives, with several seeds): a coalition evaluated by one is not evaluated
    again by the next. A sub-model is keyed by what defines it: the evaluator and the stored
    vectors with their coefficients (``sum_{i in S} p_i^S w_i``, or ``g`` for the empty
    coalition). Vectors are told apart by identity tokens that are never reused: an evaluated
    sub-model of an evicted object can never answer for a new one; stale entries just age out
    (least recently used first). Only read-only vectors (the function seals what it loads) and
    vectors held elsewhere by id (:class:`flstore_workloads.sliced.VectorRef`) are keyed.

    Parameters
    ----------
    max_entries : int
        Utilities kept.
    """

    def __init__(self, max_entries: int = 1 << 16) -> None:
        self.max_entries = max_entries
        self._values: OrderedDict[Hashable, float] = OrderedDict()
        self._tokens: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._next = 0
        self._lock = threading.RLock()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._values)

    def token(self, x: Any) -> Hashable | None:
        """A never-reused identity of ``x`` (None: ``x`` may change, so nothing is keyed)."""
        ref_id = getattr(x, "ref_id", None)
        if isinstance(ref_id, str):
            return ref_id
        flags = getattr(x, "flags", None)
        if flags is not None and flags.writeable:
            return None
        with self._lock:
            hit = self._tokens.get(id(x))
            if hit is not None and hit[0]() is x:
                return hit[1]
            self._next += 1
            try:
                ref = weakref.ref(x, functools.partial(self._dead, id(x)))
            except TypeError:
                return None
            self._tokens[id(x)] = (ref, self._next)
            return self._next

    def _dead(self, ident: int, ref: weakref.ref[Any]) -> None:
        with self._lock:
            hit = self._tokens.get(ident)
            if hit is not None and hit[0] is ref:
                del self._tokens[ident]

    def get(self, key: Hashable) -> float | None:
        with self._lock:
            v = self._values.get(key)
            if v is not None:
                self._values.move_to_end(key)
                self.hits += 1
            return v

    def put(self, key: Hashable, value: float) -> None:
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.max_entries:
                self._values.popitem(last=False)


class CoalitionUtility:
    """Memoised ``v(S)`` over coalitions given as sorted index tuples.

    Parameters
    ----------
    evaluator
        Utility of a flat model; one with ``map`` evaluates a batch at once.
    base, deltas, weights
        The round's starting model, each client's update (as rows) and aggregation weights.
    combine_many
        Materialises rows as float32 vectors (:meth:`WorkloadData.combine_many`).
    cache
        Utilities kept across queries (:class:`UtilityCache`), if any.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        base: Row,
        deltas: Sequence[Row],
        weights: NDArray[np.float64],
        *,
        combine_many: Callable[[Sequence[Row]], list[NDArray[np.float32]]] | None = None,
        cache: UtilityCache | None = None,
    ) -> None:
        self._evaluator = evaluator
        self._base = list(base)
        self._deltas = list(deltas)
        self._weights = np.asarray(weights, dtype=np.float64)
        self._combine = combine_many or (lambda rows: [combine(r) for r in rows])
        self._memo: dict[tuple[int, ...], float] = {}
        self._cache = cache
        self._full: NDArray[np.float64] | None = None
        self._width = max(1, int(getattr(evaluator, "parallel", 1))) if self._batched else 1
        self._span = _span(evaluator, _dimension(self._base))
        #: with a span: each vector's index (by identity) and their slices, read once
        self._sliced: tuple[dict[int, int], NDArray[np.float64]] | None = None
        self.reused = 0

    @property
    def evaluations(self) -> int:
        """Number of distinct coalitions evaluated (or found evaluated) so far."""
        return len(self._memo)

    @property
    def width(self) -> int:
        """Coalitions worth evaluating at once (1: the evaluator takes one at a time)."""
        return self._width

    @property
    def _batched(self) -> bool:
        return callable(getattr(self._evaluator, "map", None))

    @property
    def ahead(self) -> bool:
        """Whether a GTG cycle's prefixes are worth evaluating all at once, ahead of the
        truncation rule: the evaluator takes batches (a function: a request costs far more
        than a small model's evaluation) and the ``n^2`` sub-models of a cycle fit one batch
        of :data:`BATCH_BYTES`. The values stay those of the rule (it still decides which
        utilities count); only sub-models it would skip are evaluated too."""
        n = len(self._deltas)
        return self._batched and n * n * 4 * self._length <= BATCH_BYTES

    @property
    def _length(self) -> int:
        """Floats of one sub-model as the evaluator gets it."""
        return _dimension(self._base) if self._span is None else self._span[1] - self._span[0]

    def _direct(self, key: tuple[int, ...]) -> Row:
        """``base + sum_{i in S} p_i^S Delta_i``."""
        row: list[tuple[float, Any]] = list(self._base)
        if key:
            w = self._weights[list(key)]
            w = w / w.sum()
            for coef, i in zip(w, key, strict=True):
                row.extend((float(coef) * c, x) for c, x in self._deltas[i])
        return row

    def _row(self, key: tuple[int, ...]) -> Row:
        """The sub-model of ``key`` as a row; a large coalition as ``base + (F - sum_{i not
        in S} p_i Delta_i) / P_S`` with ``F = sum_i p_i Delta_i`` built once (float64)."""
        n = len(self._deltas)
        if n < COMPLEMENT_MIN or 2 * len(key) <= n:
            return self._direct(key)
        if self._full is None:
            rows = [self._direct(tuple(range(n))), list(self._base)]
            full, base = self._combine(rows)  # F = (sum p_i Delta_i) / P_N, the full sub-model
            self._full = (full.astype(np.float64) - base) * float(self._weights.sum())
        out = set(range(n)) - set(key)
        total = float(self._weights[list(key)].sum())
        row: list[tuple[float, Any]] = list(self._base)
        row.append((1.0 / total, self._full))
        for i in sorted(out):
            row.extend((-float(self._weights[i]) / total * c, x) for c, x in self._deltas[i])
        return row

    def _models(self, keys: Sequence[tuple[int, ...]]) -> list[NDArray[np.float32]]:
        """The sub-models of ``keys``, as the evaluator gets them (see the module)."""
        if self._span is None:
            return self._combine([self._row(k) for k in keys])
        index, slices = self._slices()
        coefs = np.zeros((len(keys), len(index)))
        for r, k in enumerate(keys):
            for c, x in merge(self._direct(k)):
                coefs[r, index[id(x)]] += c
        return list((coefs @ slices).astype(np.float32))

    def _slices(self) -> tuple[dict[int, int], NDArray[np.float64]]:
        """The round's vectors by identity, and their ``span`` (read once)."""
        if self._sliced is None:
            assert self._span is not None
            a, b = self._span
            vectors: dict[int, Any] = {}
            for _, x in [*self._base, *(t for row in self._deltas for t in row)]:
                vectors.setdefault(id(x), x)
            got = self._combine([[(1.0, x[a:b])] for x in vectors.values()])
            index = {ident: i for i, ident in enumerate(vectors)}
            self._sliced = index, np.asarray(np.stack(got), dtype=np.float64)
        return self._sliced

    def _cache_key(self, key: tuple[int, ...]) -> Hashable | None:
        if self._cache is None:
            return None
        ev = self._cache.token(self._evaluator)
        if ev is None:
            return None
        atoms = []
        for c, x in merge(self._direct(key)):
            coef = round(c, 12) + 0.0  # -0.0 and 0.0 alike
            if coef == 0.0:  # the base of a non-empty coalition: its coefficients sum to 0
                continue
            t = self._cache.token(x)
            if t is None:
                return None
            atoms.append((coef, t))
        return (ev, tuple(sorted(atoms, key=repr)))

    def __call__(self, coalition: Sequence[int]) -> float:
        key = tuple(sorted(int(i) for i in coalition))
        if key not in self._memo:
            self.prefetch([key])
        return self._memo[key]

    def prefetch(self, coalitions: Sequence[Sequence[int]]) -> None:
        """Evaluate the coalitions not evaluated yet: those a :class:`UtilityCache` knows are
        taken from it, the others built and evaluated in batches of :data:`BATCH_BYTES` (all
        at once by an evaluator with ``map``, else one by one)."""
        keys = list(dict.fromkeys(tuple(sorted(int(i) for i in c)) for c in coalitions))
        todo: list[tuple[tuple[int, ...], Hashable | None]] = []
        for k in keys:
            if k in self._memo:
                continue
            ck = self._cache_key(k)
            known = self._cache.get(ck) if self._cache is not None and ck is not None else None
            if known is not None:
                self._memo[k] = known
                self.reused += 1
            else:
                todo.append((k, ck))
        if not todo:
            return
        step = max(1, BATCH_BYTES // max(1, 4 * self._length))
        for a in range(0, len(todo), step):
            chunk = todo[a : a + step]
            models = self._models([k for k, _ in chunk])
            if self._batched:
                values = self._evaluator.map(models)  # type: ignore[attr-defined]
            else:
                values = [self._evaluator(m) for m in models]
            for (k, ck), val in zip(chunk, values, strict=True):
                self._memo[k] = float(val)
                if self._cache is not None and ck is not None:
                    self._cache.put(ck, float(val))


def _dimension(row: Row) -> int:
    return max((int(x.shape[0]) for _, x in row), default=1)


def _span(evaluator: Any, d: int) -> tuple[int, int] | None:
    """The coordinates ``[a, b)`` ``evaluator`` reads of a ``d``-float model (its ``span``),
    or None when it reads all of them."""
    span = getattr(evaluator, "span", None)
    if span is None:
        return None
    a, b = (int(x) for x in span)
    if not 0 <= a < b <= d:
        raise DataMismatch(f"the evaluator reads coordinates [{a}, {b}) of a {d}-float model")
    return None if (a, b) == (0, d) else (a, b)


def _prefetch(v: Callable[[Sequence[int]], float], coalitions: Sequence[Sequence[int]]) -> None:
    ahead = getattr(v, "prefetch", None)
    if ahead is not None:
        ahead(coalitions)


def _width(v: Callable[[Sequence[int]], float]) -> int:
    return int(getattr(v, "width", 1))


# -- pure algorithms over a utility function v(tuple_of_indices) -----------------------------------


def leave_one_out(v: Callable[[Sequence[int]], float], n: int) -> NDArray[np.float64]:
    """``phi_i = v(N) - v(N \\ {i})``."""
    _prefetch(v, [tuple(range(n))] + [tuple(j for j in range(n) if j != i) for i in range(n)])
    full = v(tuple(range(n)))
    return np.array([full - v(tuple(j for j in range(n) if j != i)) for i in range(n)])


def exact_shapley(v: Callable[[Sequence[int]], float], n: int) -> NDArray[np.float64]:
    """Exact Shapley values by enumerating all ``2^n`` coalitions (bitmask-vectorised sum)."""
    masks = np.arange(1 << n)
    _prefetch(v, [tuple(i for i in range(n) if m >> i & 1) for m in masks])
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
        _prefetch(v, [tuple(p[: j + 1]) for p in perms for j in range(n)])
    for j in range(n):
        live = [p for p in range(k) if abs(v_full - prev[p]) >= eps]
        _prefetch(v, [tuple(perms[p][: j + 1]) for p in live])
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
    _prefetch(v, [(), tuple(range(n))])
    width = _width(v)
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
                    if width > 1 and j % width == 0:  # the next prefixes, evaluated at once
                        _prefetch(v, [tuple(perm[: k + 1]) for k in range(j, min(n, j + width))])
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
        phi, info = permutation_shapley(
            v,
            n,
            guided=p.method == "gtg",
            seed=p.seed,
            eps=p.eps,
            round_trunc_threshold=p.round_trunc_threshold,
            converge_min=p.converge_min,
            last_k=p.last_k,
            converge_criteria=p.converge_criteria,
            max_permutations=p.max_permutations,
        )
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

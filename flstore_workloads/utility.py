"""The utility of coalitions of a round's clients: ``v(S)``, built and evaluated in batches,
memoised per query and across queries (:class:`UtilityCache`).

``v(S) = evaluator(g_{r-1} + sum_{i in S} p_i^S Delta_i)`` with ``p^S`` renormalised over ``S``
(:mod:`flstore_workloads.contribution` says how its algorithms ask for coalitions). A coalition
larger than half the round is built from the round's whole aggregate minus the clients left out;
an evaluator with a ``span`` is given only those coordinates of each sub-model.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._linalg import Row, combine, merge
from .data import Evaluator
from .errors import DataMismatch

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


def prefetch(v: Callable[[Sequence[int]], float], coalitions: Sequence[Sequence[int]]) -> None:
    """Tell ``v`` the coalitions an algorithm will ask for together (a :class:`CoalitionUtility`
    builds and evaluates them in batches; a plain function ignores it)."""
    ahead = getattr(v, "prefetch", None)
    if ahead is not None:
        ahead(coalitions)


def width(v: Callable[[Sequence[int]], float]) -> int:
    """How many coalitions ``v`` evaluates at once to good effect (1 for a plain function)."""
    return int(getattr(v, "width", 1))

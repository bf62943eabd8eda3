"""Streaming linear algebra over flat parameter vectors.

Every update-based workload reduces to inner products between a handful of rows, each a linear
combination of stored vectors (``w_i - g`` for an update, ``w_end - w_start`` for a change of the
global model). :func:`gram` computes them in one pass over the data, a chunk of columns at a
time: no ``N x d`` copy is made and the inputs (possibly read-only views of sealed objects) are
never written.

- Rows are formed and multiplied in float64, a block of columns at a time (a vector shared by
  several rows, the base ``g`` of ``w_i - g``, converted once per block; one BLAS call per
  block), and summed over blocks in float64, whatever the length or the data. Float32
  products, which this took for model-sized rows until issue 36, were about 1e-6 off
  (relative) where a model's norm sits in a few hundred coordinates (a classifier head), and
  FoolsGold's ``1 - max``, normalisation and logit made that 1.4e-5 in its weights at 120
  ResNet-18-sized updates; ``tests/flstore/test_workloads_linalg.py`` holds the products to
  1e-12 of an independent float64 computation on such rounds, and
  ``tests/flstore/test_reference_answers.py`` FoolsGold's weights to the reference's at 120.
- A :class:`GramCache` (held by a cache function across queries) remembers inner products between
  rows over read-only vectors, so only the pairs not yet known are computed (a new round, or the
  cross-round block of a FoolsGold window) and repeated queries cost O(n^2).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import Counter
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from .errors import DataMismatch

Vector = NDArray[np.floating]
Term = tuple[float, Vector]
Row = Sequence[Term]

CHUNK = 1 << 16  # 64 Ki columns: a 10-row float64 block is 5 MiB; smaller chunks stay in cache


def dimension(rows: Sequence[Row]) -> int:
    """Common length of every vector in ``rows``; raises :class:`DataMismatch` otherwise."""
    dims = {int(x.shape[0]) for row in rows for _, x in row if x.ndim == 1}
    bad = [x.shape for row in rows for _, x in row if x.ndim != 1]
    if bad:
        raise DataMismatch(f"parameter vectors must be flat (1-D); got shapes {bad[:3]}")
    if len(dims) > 1:
        raise DataMismatch(
            f"parameter vectors differ in length: {sorted(dims)}; all must share the job's model spec"
        )
    if not dims:
        raise DataMismatch("no parameter vectors given")
    return dims.pop()


def merge(row: Row) -> list[Term]:
    """Merge terms over the same vector object (``w - g + p g`` touches ``g`` once), drop zeros."""
    coefs: dict[int, float] = {}
    arrays: dict[int, Vector] = {}
    for coef, x in row:
        key = id(x)
        coefs[key] = coefs.get(key, 0.0) + float(coef)
        arrays[key] = x
    return [(c, arrays[k]) for k, c in coefs.items() if c != 0.0]


def _fill(
    out: NDArray[np.float64], row: Row, start: int, stop: int, scratch: NDArray[np.float64]
) -> None:
    first = True
    for coef, x in row:
        piece = x[start:stop]
        if first:
            if coef == 1.0:
                out[...] = piece
            else:
                np.multiply(piece, np.float64(coef), out=out)  # float64 loop, not float32
            first = False
        elif coef == 1.0:
            np.add(out, piece, out=out)
        elif coef == -1.0:
            np.subtract(out, piece, out=out)
        else:
            tmp = scratch[: stop - start]
            np.multiply(piece, np.float64(coef), out=tmp)
            np.add(out, tmp, out=out)
    if first:
        out[...] = 0.0


class _Blocks:
    """Rows of linear combinations, materialised a chunk of columns at a time in float64.

    Every distinct vector is converted to float64 once per chunk (a base ``g`` shared by ten rows
    ``w_i - g`` is read once, not ten times); each row is then combined from those float64 pieces
    in cache. Conversions of float32 to float64 are exact, so a row is as exact as the float64
    arithmetic of its terms.
    """

    def __init__(self, rows: Sequence[Row], chunk: int) -> None:
        self.rows = [merge(r) for r in rows]
        index: dict[int, int] = {}
        self.bases: list[Vector] = []
        for row in self.rows:
            for _, x in row:
                if id(x) not in index:
                    index[id(x)] = len(self.bases)
                    self.bases.append(x)
        self.terms = [[(c, index[id(x)]) for c, x in row] for row in self.rows]
        uses = Counter(j for t in self.terms for _, j in t)
        shared = {i for i, k in uses.items() if k > 1}
        self.convert = sorted(shared)  # vectors used by several rows: converted once per chunk
        self.slot = {b: k for k, b in enumerate(self.convert)}
        budget = max(1024, (_BLOCK_BYTES // 8) // max(1, len(self.rows) + len(self.convert)))
        self.chunk = max(1, min(chunk, budget))
        self.buf = np.empty((len(self.rows), self.chunk), dtype=np.float64)
        self.base64 = np.empty((len(self.convert), self.chunk), dtype=np.float64)
        self.scratch = np.empty(self.chunk, dtype=np.float64)

    def block(self, start: int, stop: int) -> NDArray[np.float64]:
        """The rows' columns ``start:stop`` as an ``(n_rows, stop - start)`` block."""
        w = stop - start
        conv = self.base64[:, :w]
        for k, b in enumerate(self.convert):
            conv[k] = self.bases[b][start:stop]
        out = self.buf[:, :w]
        tmp = self.scratch[:w]
        for a, terms in enumerate(self.terms):
            row = out[a]
            if not terms:
                row[...] = 0.0
                continue
            for t, (coef, b) in enumerate(terms):
                piece = conv[self.slot[b]] if b in self.slot else self.bases[b][start:stop]
                if t == 0:
                    if coef == 1.0:
                        row[...] = piece
                    else:
                        np.multiply(piece, np.float64(coef), out=row)
                elif coef == 1.0:
                    np.add(row, piece, out=row)
                elif coef == -1.0:
                    np.subtract(row, piece, out=row)
                else:
                    np.multiply(piece, np.float64(coef), out=tmp)
                    np.add(row, tmp, out=row)
        return out


_BLOCK_BYTES = 6 << 20  # float64 scratch per chunk (rows + shared vectors): stays in L2/L3


def _products(
    rows: Sequence[Row],
    left: Sequence[int],
    others: Sequence[int],
    d: int,
    chunk: int,
    *,
    square: bool,
) -> tuple[NDArray[np.float64] | None, NDArray[np.float64]]:
    """Inner products in float64, one pass over the columns of the rows involved.

    Returns ``(L, X)``: ``L[i, j] = <rows[left[i]], rows[left[j]]>`` (only when ``square``; a
    symmetric rank-k update, BLAS syrk) and ``X[i, j] = <rows[left[i]], rows[others[j]]>``.
    BLAS runs single-threaded: these products are memory-bound, and on a small shared machine a
    second BLAS thread waiting on a busy core costs far more than it gains.
    """
    from threadpoolctl import threadpool_limits

    blocks = _Blocks([rows[i] for i in [*left, *others]], chunk)
    m = len(left)
    sq = np.zeros((m, m), dtype=np.float64) if square else None
    cross = np.zeros((m, len(others)), dtype=np.float64)
    with threadpool_limits(1, user_api="blas"):
        for start in range(0, d, blocks.chunk):
            stop = min(start + blocks.chunk, d)
            b = blocks.block(start, stop)
            top = b[:m]
            if sq is not None:
                sq += top @ top.T
            if others:
                cross += top @ b[m:].T
    return sq, cross


def gram(
    rows: Sequence[Row],
    *,
    chunk: int = CHUNK,
    cache: GramCache | None = None,
) -> NDArray[np.float64]:
    """Gram matrix ``G[a, b] = <row_a, row_b>`` of linear combinations of vectors, in float64.

    Parameters
    ----------
    rows : sequence of rows
        Each row is a sequence of ``(coefficient, vector)`` terms; the row is their sum.
    chunk : int
        Columns processed at a time (at most; bounded so the float64 scratch stays in cache).
    cache : GramCache, optional
        Memo of inner products between rows over read-only vectors (a cache function's): only the
        pairs it does not hold are computed, reading only the rows they involve.

    Returns
    -------
    numpy.ndarray
        ``(len(rows), len(rows))`` symmetric float64 matrix.
    """
    n = len(rows)
    d = dimension(rows)
    g = np.full((n, n), np.nan, dtype=np.float64)
    keys = [cache.key(r) for r in rows] if cache is not None else [None] * n
    if cache is not None:
        cache.fill(keys, g)
    missing = np.isnan(g)  # symmetric: the memo fills both halves
    if not missing.any():
        return g
    if missing.all():  # nothing known (no memo, a new round): every row, one square product
        left, others, square = list(range(n)), [], True
    else:
        left = _cover(missing)
        inleft = np.zeros(n, dtype=bool)
        inleft[left] = True
        others = [int(i) for i in np.flatnonzero(missing.any(axis=1) & ~inleft)]
        square = bool(missing[np.ix_(inleft, inleft)].any())
    sq, cross = _products(rows, left, others, d, chunk, square=square)
    if not (np.all(np.isfinite(cross)) and (sq is None or np.all(np.isfinite(sq)))):
        raise DataMismatch("parameter vectors contain non-finite values (NaN or inf)")
    if sq is not None:
        sq = (sq + sq.T) / 2.0
        g[np.ix_(left, left)] = sq
    if others:
        g[np.ix_(left, others)] = cross
        g[np.ix_(others, left)] = cross.T
    if cache is not None:
        if sq is not None:
            cache.store(keys, left, left, sq)
        if others:
            cache.store(keys, left, others, cross)
    if np.isnan(g).any():  # unreachable: the cover spans every missing pair
        raise AssertionError("gram: a pair was left uncomputed")
    return g


def _cover(missing: NDArray[np.bool_]) -> list[int]:
    """Rows whose products with the others cover every missing pair (greedy vertex cover).

    ``missing[a, b]``: the pair ``(a, b)`` is to be computed (symmetric; ``(a, a)``, a row's
    norm, needs ``a`` itself). Each step takes the row in the most missing pairs (the lowest
    index among equals), on a boolean matrix: the step is O(n^2) in numpy, not a pass over
    Python tuples (0.2-0.4 s at 200 rows, paid once per streamed chunk before)."""
    left: list[int] = []
    rest = np.array(missing, dtype=bool, copy=True)
    rest |= rest.T
    count = rest.sum(axis=1)
    while count.any():
        best = int(np.argmax(count))
        left.append(best)
        count -= rest[:, best]
        rest[best, :] = False
        rest[:, best] = False
        count[best] = 0
    return sorted(left)


AtomKey = tuple[tuple[float, int], ...]


class GramCache:
    """Memo of inner products between rows, for data that stays in memory across queries.

    A cache function answers many queries on the same round (cosine, Krum, k-means and
    personalization all need the Gram matrix of that round's updates; FoolsGold and provenance
    need it across rounds): with this memo only the first pays the pass over the vectors, later
    ones cost O(n^2). A row is cached only when every vector in it is read-only (the function
    seals what it loads); entries are keyed by the vectors' identities and dropped as soon as a
    vector is garbage-collected (weak references), so an evicted object never answers for a new
    one.

    Parameters
    ----------
    max_pairs : int
        Entries kept; the memo is cleared when it would grow beyond this.
    """

    def __init__(self, max_pairs: int = 1 << 18) -> None:
        self.max_pairs = max_pairs
        self._pairs: dict[tuple[AtomKey, AtomKey], float] = {}
        self._by_id: dict[int, set[tuple[AtomKey, AtomKey]]] = {}
        self._refs: dict[int, weakref.ref[Vector]] = {}
        self._lock = threading.RLock()  # weakref callbacks may fire inside
        self.hits = 0
        self.computed = 0

    def __len__(self) -> int:
        return len(self._pairs)

    def key(self, row: Row) -> AtomKey | None:
        """Canonical key of ``row`` or ``None`` when it involves a writable vector."""
        merged = merge(row)
        if not merged or any(x.flags.writeable for _, x in merged):
            return None
        with self._lock:
            for _, x in merged:
                ref = self._refs.get(id(x))
                if ref is None or ref() is not x:
                    self._forget(id(x))
                    self._refs[id(x)] = weakref.ref(x, functools.partial(self._dead, id(x)))
        return tuple(sorted((float(c), id(x)) for c, x in merged))

    @staticmethod
    def _pair(a: AtomKey, b: AtomKey) -> tuple[AtomKey, AtomKey]:
        return (a, b) if a <= b else (b, a)

    def fill(self, keys: Sequence[AtomKey | None], g: NDArray[np.float64]) -> None:
        """Write every held ``<row_a, row_b>`` into ``g`` (others untouched)."""
        with self._lock:
            for a, ka in enumerate(keys):
                if ka is None:
                    continue
                for b in range(a, len(keys)):
                    kb = keys[b]
                    if kb is None:
                        continue
                    v = self._pairs.get(self._pair(ka, kb))
                    if v is not None:
                        g[a, b] = g[b, a] = v
                        self.hits += 1

    def store(
        self,
        keys: Sequence[AtomKey | None],
        left: Sequence[int],
        right: Sequence[int],
        prod: NDArray[np.float64],
    ) -> None:
        """Remember ``prod[i, j] = <row_left[i], row_right[j]>``."""
        with self._lock:
            if len(self._pairs) + prod.size > self.max_pairs:
                self._pairs.clear()
                self._by_id.clear()
            for i, a in enumerate(left):
                ka = keys[a]
                if ka is None:
                    continue
                for j, b in enumerate(right):
                    kb = keys[b]
                    if kb is None:
                        continue
                    pk = self._pair(ka, kb)
                    self._pairs[pk] = float(prod[i, j])
                    self.computed += 1
                    for _, ident in ka + kb:
                        self._by_id.setdefault(ident, set()).add(pk)

    def _forget(self, ident: int) -> None:
        for pk in self._by_id.pop(ident, ()):
            self._pairs.pop(pk, None)
        self._refs.pop(ident, None)

    def _dead(self, ident: int, ref: weakref.ref[Vector]) -> None:
        with self._lock:
            if self._refs.get(ident) is ref:
                self._forget(ident)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._pairs.clear()
            self._by_id.clear()
            self._refs.clear()


def combine(row: Row, *, chunk: int = CHUNK) -> NDArray[np.float32]:
    """Materialise one row (a linear combination of vectors) as a new float32 vector."""
    d = dimension([row])
    row = merge(row)
    out = np.empty(d, dtype=np.float32)
    buf = np.empty(min(chunk, d), dtype=np.float64)
    scratch = np.empty(min(chunk, d), dtype=np.float64)
    for start in range(0, d, chunk):
        stop = min(start + chunk, d)
        piece = buf[: stop - start]
        _fill(piece, row, start, stop, scratch)
        out[start:stop] = piece
    return out


def distances(g: NDArray[np.float64]) -> NDArray[np.float64]:
    """Squared Euclidean distances ``||x_a - x_b||^2`` from a Gram matrix (clipped at 0)."""
    diag = np.diag(g)
    d2 = diag[:, None] + diag[None, :] - 2.0 * g
    np.fill_diagonal(d2, 0.0)
    return np.maximum(d2, 0.0)


def cosines(g: NDArray[np.float64]) -> NDArray[np.float64]:
    """Cosine matrix from a Gram matrix; a zero vector has cosine 0 with everything."""
    norms = np.sqrt(np.maximum(np.diag(g), 0.0))
    denom = np.outer(norms, norms)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(denom > 0, g / np.where(denom > 0, denom, 1.0), 0.0)
    return np.clip(c, -1.0, 1.0)


def embed(g: NDArray[np.float64]) -> NDArray[np.float64]:
    """Points in ``R^n`` with exactly the inner products ``g`` (up to round-off).

    k-means, silhouettes and every distance only depend on inner products, so running them on this
    ``n x n`` embedding gives the same answer as on the ``n x d`` updates.
    """
    vals, vecs = np.linalg.eigh(g)
    vals = np.maximum(vals, 0.0)
    return np.asarray(vecs * np.sqrt(vals)[None, :], dtype=np.float64)

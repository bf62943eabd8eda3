"""Streaming linear algebra over flat parameter vectors.

Every update-based workload reduces to inner products between a handful of rows, each a linear
combination of stored vectors (``w_i - g`` for an update, ``sum_t p_i^t (w_i^t - g_{t-1})`` for a
provenance contribution). :func:`gram` computes all those inner products in one pass over the data,
in float64, a chunk of columns at a time: no ``N x d`` copy is made and the inputs (possibly
read-only views of sealed objects) are never written.
"""

from __future__ import annotations

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
        raise DataMismatch(f"parameter vectors differ in length: {sorted(dims)}; all must share the job's model spec")
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


def _fill(out: NDArray[np.float64], row: Row, start: int, stop: int, scratch: NDArray[np.float64]) -> None:
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


def gram(rows: Sequence[Row], *, chunk: int = CHUNK) -> NDArray[np.float64]:
    """Gram matrix ``G[a, b] = <row_a, row_b>`` of linear combinations of vectors, in float64.

    Parameters
    ----------
    rows : sequence of rows
        Each row is a sequence of ``(coefficient, vector)`` terms; the row is their sum.
    chunk : int
        Columns processed at a time (bounds the scratch memory to ``len(rows) * chunk * 8`` bytes).

    Returns
    -------
    numpy.ndarray
        ``(len(rows), len(rows))`` symmetric float64 matrix.
    """
    n = len(rows)
    d = dimension(rows)
    g = np.zeros((n, n), dtype=np.float64)
    buf = np.empty((n, min(chunk, d)), dtype=np.float64)
    scratch = np.empty(min(chunk, d), dtype=np.float64)
    for start in range(0, d, chunk):
        stop = min(start + chunk, d)
        block = buf[:, : stop - start]
        for a, row in enumerate(rows):
            _fill(block[a], row, start, stop, scratch)
        g += block @ block.T
    if not np.all(np.isfinite(g)):
        raise DataMismatch("parameter vectors contain non-finite values (NaN or inf)")
    return (g + g.T) / 2.0


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

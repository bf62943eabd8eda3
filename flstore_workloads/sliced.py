"""Workloads over vectors held in coordinate slices ("parts") by several processes.

A round too large for one process is held in parts: part ``s`` of ``S`` holds coordinates
``[a_s, b_s)`` (:func:`part_bounds`) of every vector of the round. Every workload reads vectors
only through :meth:`WorkloadData.gram` (inner products between rows, each row a linear
combination of vectors), :meth:`WorkloadData.combine_many` (rows materialised) and
:meth:`WorkloadData.digest`, and each of these is exact over parts:

- a Gram matrix is the sum over parts of each part's Gram matrix (an inner product is a sum
  over coordinates): cosines, Krum and Multi-Krum, FoolsGold, k-means, provenance;
- a row materialised is the concatenation of each part's slice of it: the sub-models of
  leave-one-out and Shapley (which the evaluator then gets whole), personalised models;
- a digest is that of the vector assembled from its slices.

A row may be materialised over a coordinate range only (``x[a:b]`` of a :class:`VectorRef` is
a reference to that range): only the parts that overlap it are asked, and only for the
overlap (a contribution workload whose evaluator reads a model's head: its sub-models need
those coordinates alone, :class:`~flstore_workloads.utility.CoalitionUtility`).

:class:`SlicedData` is the :class:`WorkloadData` a reducer runs a workload on: its vectors are
:class:`VectorRef` stand-ins (an object id and a length) and its :class:`Parts` backend does the
math on the parts where they are held; :func:`part_gram` and :func:`part_combine` are what each
holder of a part runs. Rows given to :meth:`SlicedData.combine_many` may also hold local
vectors (a contribution workload's aggregate, built once): those terms are added at the reducer.
:class:`LocalParts` holds the parts in this process (the obvious reference, and tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ._linalg import GramCache, Row, combine, gram, merge
from .data import WorkloadData
from .errors import DataMismatch

#: part boundaries fall on multiples of this many floats (64 bytes)
ALIGN = 16
#: a row as sent to the holders of parts: ``[(coefficient, object id), ...]``
RowSpec = list[tuple[float, str]]


def max_parts(d: int) -> int:
    """The most parts a vector of ``d`` floats is cut into (each at least :data:`ALIGN`)."""
    return max(1, d // ALIGN)


def part_bounds(d: int, parts: int) -> list[tuple[int, int]]:
    """``[(a_s, b_s), ...]``: ``parts`` contiguous coordinate ranges covering ``[0, d)``, of
    near-equal length, inner boundaries on multiples of :data:`ALIGN`.

    Raises
    ------
    ValueError
        ``parts`` outside ``1..max_parts(d)``.
    """
    if not 1 <= parts <= max_parts(d):
        raise ValueError(f"{parts} parts of a {d}-float vector: must be 1..{max_parts(d)}")
    cuts = [0] + [(s * d // parts) // ALIGN * ALIGN for s in range(1, parts)] + [d]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


#: coordinates a local term is added over at a time (bounded float64 scratch)
CHUNK = 1 << 20


def _length(terms: Sequence[tuple[float, Any]]) -> int:
    return int(np.asarray(terms[0][1]).shape[0])


def _add_local(row: NDArray[np.float32], terms: Sequence[tuple[float, Any]], base: bool) -> None:
    """``row += sum c x`` in place, in float64 a chunk at a time, rounded to float32 once
    (``base``: ``row`` holds the stored vectors' part of the sum; else it starts at 0)."""
    for a in range(0, row.shape[0], CHUNK):
        b = min(row.shape[0], a + CHUNK)
        acc = row[a:b].astype(np.float64) if base else np.zeros(b - a)
        for c, x in terms:
            acc += c * np.asarray(x[a:b], dtype=np.float64)
        row[a:b] = acc


class VectorRef:
    """A stored vector held elsewhere in parts, standing in for it in rows.

    Parameters
    ----------
    ref_id : str
        The object's id (what the holders of its parts know it by).
    size : int
        Its length in floats.

    offset : int
        Where this reference starts in the object (a reference to a range, ``x[a:b]``).
    """

    ndim = 1
    dtype = np.dtype(np.float32)

    def __init__(self, ref_id: str, size: int, offset: int = 0) -> None:
        self.ref_id = ref_id
        self.size = size
        self.offset = offset
        self.shape = (size,)

    @property
    def span(self) -> tuple[int, int]:
        """The object's coordinates ``[a, b)`` this reference stands for."""
        return self.offset, self.offset + self.size

    def __getitem__(self, key: slice) -> VectorRef:
        """``x[a:b]``: a reference to that range (a step is refused)."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a VectorRef takes a contiguous range x[a:b] only")
        a, b, _ = key.indices(self.size)
        return VectorRef(self.ref_id, max(0, b - a), self.offset + a)

    def __repr__(self) -> str:
        tail = f", offset={self.offset}" if self.offset else ""
        return f"VectorRef({self.ref_id!r}, {self.size}{tail})"


def row_spec(row: Row) -> RowSpec:
    """``row`` (over :class:`VectorRef` s only) as sent to the holders of parts."""
    out: RowSpec = []
    for c, x in merge(row):
        if not isinstance(x, VectorRef) or x.offset:
            raise DataMismatch(
                "a Gram row sent to the holders of parts may only name whole stored vectors"
            )
        out.append((float(c), x.ref_id))
    return out


def _common_span(refs: Sequence[VectorRef]) -> tuple[int, int]:
    spans = {x.span for x in refs}
    if len(spans) != 1:
        raise DataMismatch(f"rows over different coordinate ranges in one batch: {sorted(spans)}")
    return spans.pop()


class Parts(Protocol):
    """The math on vectors held in parts (see the module)."""

    def gram(self, rows: Sequence[RowSpec]) -> NDArray[np.float64]:
        """Gram matrix of ``rows`` over the whole length."""
        ...

    def combine(
        self, rows: Sequence[RowSpec], span: tuple[int, int] | None = None
    ) -> list[NDArray[np.float32]]:
        """Each row materialised over the whole length, or over coordinates ``span``."""
        ...


def _resolve(
    rows: Sequence[RowSpec], vector: Callable[[str], NDArray[np.floating]]
) -> list[list[tuple[float, NDArray[np.floating]]]]:
    return [[(float(c), vector(i)) for c, i in row] for row in rows]


def part_gram(
    rows: Sequence[RowSpec],
    vector: Callable[[str], NDArray[np.floating]],
    cache: GramCache | None = None,
) -> NDArray[np.float64]:
    """One part's Gram matrix of ``rows`` (float64 products); ``vector(id)`` is this part's
    slice of an object (a ``KeyError`` for one not held here)."""
    return gram(_resolve(rows, vector), cache=cache)


def part_combine(
    rows: Sequence[RowSpec], vector: Callable[[str], NDArray[np.floating]]
) -> list[NDArray[np.float32]]:
    """One part's slice of each row materialised (``vector`` as in :func:`part_gram`)."""
    return [combine(r) for r in _resolve(rows, vector)]


@dataclass
class LocalParts:
    """:class:`Parts` held in this process: ``parts[s][id]`` is part ``s`` of object ``id``."""

    parts: Sequence[Mapping[str, NDArray[np.floating]]]

    def gram(self, rows: Sequence[RowSpec]) -> NDArray[np.float64]:
        grams = (part_gram(rows, p.__getitem__) for p in self.parts)
        return np.asarray(sum(grams), dtype=np.float64)

    def combine(
        self, rows: Sequence[RowSpec], span: tuple[int, int] | None = None
    ) -> list[NDArray[np.float32]]:
        pieces = []
        start = 0
        for p in self.parts:
            stop = start + int(next(iter(p.values())).shape[0])
            lo, hi = (start, stop) if span is None else (max(start, span[0]), min(stop, span[1]))
            if lo < hi:
                cut = {i: x[lo - start : hi - start] for i, x in p.items()}
                pieces.append(part_combine(rows, cut.__getitem__))
            start = stop
        return [np.concatenate([pc[i] for pc in pieces]) for i in range(len(rows))]

    @classmethod
    def cut(cls, vectors: Mapping[str, NDArray[np.floating]], parts: int) -> LocalParts:
        """``vectors`` (one length) cut into ``parts`` parts."""
        d = {int(v.shape[0]) for v in vectors.values()}.pop()
        return cls([{i: v[a:b] for i, v in vectors.items()} for a, b in part_bounds(d, parts)])


@dataclass
class SlicedData(WorkloadData):
    """A :class:`WorkloadData` whose vectors are held in parts (see the module): ``updates``
    and ``globals`` hold :class:`VectorRef` s, ``parts`` does the math."""

    parts: Parts | None = None

    def _parts(self) -> Parts:
        if self.parts is None:
            raise DataMismatch("SlicedData without a parts backend")
        return self.parts

    def gram(self, rows: Sequence[Row]) -> NDArray[np.float64]:
        return self._parts().gram([row_spec(r) for r in rows])

    def combine_many(self, rows: Sequence[Row]) -> list[NDArray[np.float32]]:
        """Terms over stored vectors are combined where the parts are; terms over local
        vectors are then added here (in float64, rounded to float32 once)."""
        remote: list[RowSpec] = []
        local: list[list[tuple[float, Any]]] = []
        refs: list[VectorRef] = []
        for row in rows:
            spec: RowSpec = []
            mine: list[tuple[float, Any]] = []
            for c, x in merge(row):
                if isinstance(x, VectorRef):
                    spec.append((float(c), x.ref_id))
                    refs.append(x)
                else:
                    mine.append((float(c), x))
            remote.append(spec)
            local.append(mine)
        asked = [i for i, spec in enumerate(remote) if spec]
        span = _common_span(refs) if refs else None
        got = dict(zip(asked, self._parts().combine([remote[i] for i in asked], span), strict=True))
        out: list[NDArray[np.float32]] = []
        for i, mine in enumerate(local):
            if not mine:
                out.append(got[i])
                continue
            vec = got.get(i)
            if vec is None or not vec.flags.writeable:
                vec = np.zeros(_length(mine), np.float32) if vec is None else vec.copy()
            _add_local(vec, mine, i in got)
            out.append(vec)
        return out

    def digest(self, x: Any) -> str:
        if isinstance(x, VectorRef):
            x = self.combine_many([[(1.0, x)]])[0]  # type: ignore[list-item]
        return super().digest(x)

"""A cache function's side of queries over rounds held in coordinate parts.

A query whose models do not fit one function runs across functions (the math:
:mod:`flstore_workloads.sliced`). The cache engine's plan names, for each coordinate range
``[a, b)`` of the models, the function that computes it (``slices``); one of them, the reducer,
gets the query's ``/run`` and runs the workload on a :class:`~flstore_workloads.sliced.SlicedData`
whose :class:`RemoteParts` asks every range's function for its part (``POST /part``; its own
part it computes in process) and sums or joins the answers.

``POST /part`` ``{"op": "gram" | "combine", "bounds": [a, b], "part": [s, S] | null,
"span"?: [a', b'], "dim"?: d, "objects": [ids], "rows": [[[coefficient, id], ...], ...], "source"?:
{"credentials": {job: grant}}}``: each id is read over ``[a, b)`` (only over ``[a', b')``
within it, given a ``span``; ``dim``: the models' length, on which a Gram matrix's
float32 or float64 products are chosen as over the whole vectors) from what the function holds: part ``s`` of ``S``
of it, or the whole object; without either, from the cold store by ranged reads when the plan
gives a ``source`` (the engine does so past the node's memory budget: nothing is kept, one
streamed ``/part`` runs at a time on a function, and it holds at most the source's
``chunk_bytes`` (default :data:`STREAM_BYTES`) of objects at a time), else 409 ``not_held``.
The answer is raw little-endian bytes: the float64 ``n x n`` Gram matrix of the rows over the
range, or the float32 ``k x (b - a)`` slices of the rows (``b' - a'`` given a ``span``). A
reducer asks a few functions at once (:data:`PARTS_AT_ONCE`, those that stream first), and each
function's ranges one after the other.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from cache_engine.cold_store import ColdStore, TensorIndex
from cache_engine.keys import ObjectKey
from flstore_workloads import GramCache
from flstore_workloads._linalg import gram
from flstore_workloads.sliced import RowSpec, part_combine, part_gram

log = logging.getLogger(__name__)

#: the most bytes of objects a streamed ``/part`` reads from the cold store at a time, unless
#: the source says otherwise (``chunk_bytes``, within :data:`CHUNK_BYTES_RANGE`)
STREAM_BYTES = 64 << 20
CHUNK_BYTES_RANGE = (1 << 20, 1 << 30)
#: ranged reads under way at once while streaming
READERS = 4
#: MinIO reads an object's bytes in blocks of this size (its erasure block), each whole
STORE_BLOCK = 1 << 20
#: functions a reducer asks for their parts at once: the node's cores, and one more (so that
#: a core is busy while a function waits on its reads)
PARTS_AT_ONCE = len(os.sched_getaffinity(0)) + 1
#: a part answer larger than this is refused (a reducer asks for fewer rows at a time)
MAX_ANSWER = 1 << 30
#: how long a streamed object's tensor index is reused (objects of a round never change; a
#: job created again under its name may rewrite them)
INDEX_TTL_S = 300.0


#: the function's ``/part`` profile (its status, summed since it started): answers given;
#: seconds computing on held objects; for streamed answers, seconds waiting for the stream
#: (another streamed ``/part`` running here), reading tensor indexes, reading ranges from the
#: cold store and computing on the chunks read; bytes and ranged reads from the cold store,
#: objects' chunks streamed; as a reducer, seconds waiting for the parts' answers
PROFILE = (
    "part_answers",
    "part_held_s",
    "stream_wait_s",
    "stream_index_s",
    "stream_read_s",
    "stream_compute_s",
    "streamed_bytes",
    "streamed_requests",
    "streamed_reads",
    "reducer_parts_s",
)


class NotHeld(LookupError):
    """Objects a ``/part`` needs that this function neither holds nor may read."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"objects not held here: {missing[:5]}")
        self.missing = missing


@dataclass
class PartRequest:
    """A parsed ``POST /part`` body (see the module)."""

    op: str
    bounds: tuple[int, int]
    part: tuple[int, int] | None
    objects: list[str]
    rows: list[RowSpec]
    source: dict[str, Any] | None = None
    #: the coordinates computed, within ``bounds`` (None: all of ``bounds``)
    span: tuple[int, int] | None = None
    #: the models' whole length (None: unknown)
    dim: int | None = None

    @property
    def cols(self) -> tuple[int, int]:
        """The coordinates ``[a, b)`` this request computes."""
        return self.span or self.bounds

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PartRequest:
        """Raises ValueError saying what is wrong."""
        op = body.get("op")
        if op not in ("gram", "combine"):
            raise ValueError("'op' must be 'gram' or 'combine'")
        bounds = body.get("bounds")
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in bounds)
            or not 0 <= bounds[0] < bounds[1]
        ):
            raise ValueError("'bounds' must be [a, b] with 0 <= a < b")
        part = body.get("part")
        if part is not None and (
            not isinstance(part, list)
            or len(part) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in part)
            or not 0 <= part[0] < part[1]
        ):
            raise ValueError("'part' must be [s, S] with 0 <= s < S, or null")
        span = body.get("span")
        if span is not None and (
            not isinstance(span, list)
            or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            or not bounds[0] <= span[0] < span[1] <= bounds[1]
        ):
            raise ValueError("'span' must be [a', b'] with a <= a' < b' <= b of 'bounds', or null")
        dim = body.get("dim")
        if dim is not None and (
            not isinstance(dim, int) or isinstance(dim, bool) or dim < bounds[1]
        ):
            raise ValueError("'dim' must be the models' length (at least the end of 'bounds')")
        objects = body.get("objects")
        if not isinstance(objects, list) or not all(isinstance(x, str) for x in objects):
            raise ValueError("'objects' must be a list of object ids")
        known = set(objects)
        rows = body.get("rows")
        if not isinstance(rows, list) or not rows:
            raise ValueError("'rows' must be a non-empty list of rows [[coefficient, id], ...]")
        parsed: list[RowSpec] = []
        for row in rows:
            if not isinstance(row, list) or not row:
                raise ValueError("each row must be a non-empty list of [coefficient, id]")
            terms: RowSpec = []
            for t in row:
                ok = (
                    isinstance(t, list)
                    and len(t) == 2
                    and isinstance(t[0], int | float)
                    and not isinstance(t[0], bool)
                    and np.isfinite(t[0])
                    and t[1] in known
                )
                if not ok:
                    raise ValueError("a term must be [finite coefficient, id of one of 'objects']")
                terms.append((float(t[0]), str(t[1])))
            parsed.append(terms)
        n = len(parsed)
        lo, hi = span or bounds
        size = 8 * n * n if op == "gram" else 4 * n * (hi - lo)
        if size > MAX_ANSWER:
            raise ValueError(f"an answer of {size} bytes (at most {MAX_ANSWER}): fewer rows")
        source = body.get("source")
        if source is not None and not isinstance(source, dict):
            raise ValueError("'source' must be an object {credentials}, from the cache engine")
        lo_b, hi_b = CHUNK_BYTES_RANGE
        chunk = None if source is None else source.get("chunk_bytes")
        if chunk is not None and (
            not isinstance(chunk, int) or isinstance(chunk, bool) or not lo_b <= chunk <= hi_b
        ):
            raise ValueError(f"'source.chunk_bytes' must be an integer in {lo_b}..{hi_b}")
        return cls(
            op,
            (bounds[0], bounds[1]),
            None if part is None else (part[0], part[1]),
            list(objects),
            parsed,
            source,
            None if span is None else (span[0], span[1]),
            dim,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.op,
            "bounds": list(self.bounds),
            "part": None if self.part is None else list(self.part),
            "objects": self.objects,
            "rows": [[[c, i] for c, i in r] for r in self.rows],
        }
        if self.source is not None:
            out["source"] = self.source
        if self.span is not None:
            out["span"] = list(self.span)
        if self.dim is not None:
            out["dim"] = self.dim
        return out


@dataclass
class Holdings:
    """What a ``/part`` reads from: the function's objects, and the cold store past them."""

    #: the held object under a key (a part or a whole), None when not held
    held: Callable[[ObjectKey], NDArray[np.floating] | None]
    #: a cold store reading a job's objects with the engine's grant (``source``)
    cold: Callable[[str, Mapping[str, Any]], ColdStore] | None = None
    gram_cache: GramCache | None = None
    #: what the ``/part`` answers cost, summed since the function started (its status;
    #: :data:`PROFILE`)
    stats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PROFILE, 0))
    #: objects' tensor indexes, read once per :data:`INDEX_TTL_S` (a query streams an object
    #: many times: once per batch of sub-models)
    indexes: dict[str, tuple[TensorIndex, float]] = field(default_factory=dict)
    #: held while a ``/part`` streams from the cold store: one stream at a time, so that the
    #: function holds one ``chunk_bytes`` of streamed objects, as the engine's plan counts it
    streaming: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def index(self, store: ColdStore, key: ObjectKey) -> TensorIndex:
        now = time.monotonic()
        hit = self.indexes.get(key.id)
        if hit is not None and now - hit[1] < INDEX_TTL_S:
            return hit[0]
        index = store.header(key)
        if len(self.indexes) >= 4096:
            self.indexes.clear()
        self.indexes[key.id] = (index, now)
        return index

    def view(self, req: PartRequest, ident: str) -> NDArray[np.floating] | None:
        """Coordinates ``req.bounds`` of object ``ident`` as held here (no copy), or None."""
        key = ObjectKey.parse(ident)
        a, b = req.bounds
        if req.part is not None:
            x = self.held(key.with_part(*req.part))
            if x is not None:
                if x.shape[0] != b - a:
                    raise ValueError(
                        f"part {req.part} of {ident} has {x.shape[0]} floats, not {b - a}"
                    )
                return x
        x = self.held(key)
        if x is not None:
            if x.shape[0] < b:
                raise ValueError(f"{ident} has {x.shape[0]} floats: no range [{a}, {b})")
            return x[a:b]
        return None


def serve(body: Mapping[str, Any], h: Holdings) -> bytes:
    """Answer one ``POST /part`` (see the module). Raises ValueError (400), :class:`NotHeld`
    (409) or the cold store's errors."""
    req = PartRequest.parse(body)
    ids = sorted({i for row in req.rows for _, i in row})
    lo, hi = (c - req.bounds[0] for c in req.cols)
    views = {i: None if v is None else v[lo:hi] for i, v in ((i, h.view(req, i)) for i in ids)}
    missing = [i for i, v in views.items() if v is None]
    if missing and (req.source is None or h.cold is None):
        raise NotHeld(missing)
    h.stats["part_answers"] += 1
    if missing:
        return _stream(req, views, missing, h)
    t0 = time.perf_counter()
    held = {i: v for i, v in views.items() if v is not None}
    if req.op == "gram":
        out = part_gram(req.rows, held.__getitem__, h.gram_cache).tobytes()
    else:
        out = b"".join(x.tobytes() for x in part_combine(req.rows, held.__getitem__))
    h.stats["part_held_s"] += time.perf_counter() - t0
    return out


def chunks(a: int, b: int, step: int, index: TensorIndex) -> list[int]:
    """Where coordinates ``[a, b)`` are cut into the chunks a stream reads: ``[a, c1, ..., b]``,
    each chunk at most ``step`` floats (at least 1024). Where a chunk holds whole
    :data:`STORE_BLOCK` s and the object's floats lie in one float32 run, the cuts fall on the
    blocks of the object's bytes: MinIO reads an object a whole block at a time, so a ranged
    read that starts or ends inside a block reads (and checks) bytes it does not send."""
    step = max(1024, step)
    block = STORE_BLOCK // 4
    start = index.flat_start()
    if step < block or start is None or start % 4:
        return [*range(a, b, step), b]
    step = step // block * block
    first = a + (-(start + 4 * a) % STORE_BLOCK) // 4  # the first cut on a block
    return [a, *range(first, b, step)[first == a :], b] if first < b else [a, b]


def _stream(
    req: PartRequest,
    views: Mapping[str, NDArray[np.floating] | None],
    missing: list[str],
    h: Holdings,
) -> bytes:
    """The part answer with the objects not held here read from the cold store a chunk of
    coordinates at a time, nothing kept (``views``: the held objects over ``req.cols``).

    The chunk is one buffer of at most the source's ``chunk_bytes``, allocated once and
    refilled chunk after chunk, and this function streams one ``/part`` at a time
    (:attr:`Holdings.streaming`): the cache engine gives each streaming function
    ``chunk_bytes`` of the queries' working memory, however many of a query's ranges, or
    queries, it is sent at once."""
    assert h.cold is not None and req.source is not None
    grants = req.source.get("credentials") or {}
    keys = {i: ObjectKey.parse(i) for i in missing}
    stores = {i: h.cold(k.job, grants) for i, k in keys.items()}
    t0 = time.perf_counter()
    with h.streaming, ThreadPoolExecutor(READERS, thread_name_prefix="part-read") as pool:
        t1 = time.perf_counter()
        indexes: dict[str, TensorIndex] = dict(
            zip(missing, pool.map(lambda i: h.index(stores[i], keys[i]), missing), strict=True)
        )
        t2 = time.perf_counter()
        h.stats["stream_wait_s"] += t1 - t0
        h.stats["stream_index_s"] += t2 - t1
        a, b = req.cols
        at_once = int(req.source.get("chunk_bytes") or STREAM_BYTES)
        cuts = chunks(a, b, at_once // (4 * len(missing)), indexes[missing[0]])
        step = max(y - x for x, y in zip(cuts, cuts[1:], strict=False))
        buf = np.empty((len(missing), step), dtype=np.float32)
        h.stats["streamed_buffer_bytes"] = max(h.stats.get("streamed_buffer_bytes", 0), buf.nbytes)
        n = len(req.rows)
        acc = np.zeros((n, n)) if req.op == "gram" else None
        out = None if req.op == "gram" else np.empty((n, b - a), dtype=np.float32)

        def one(c0: int, c1: int) -> None:
            def read(row: int) -> None:
                i = missing[row]
                stores[i].read_range(keys[i], c0, c1, indexes[i], out=buf[row, : c1 - c0])

            r0 = time.perf_counter()
            list(pool.map(read, range(len(missing))))
            r1 = time.perf_counter()
            h.stats["stream_read_s"] += r1 - r0
            h.stats["streamed_bytes"] += 4 * len(missing) * (c1 - c0)
            h.stats["streamed_requests"] += sum(indexes[i].reads(c0, c1) for i in missing)
            chunk: dict[str, NDArray[np.floating]] = {
                i: buf[row, : c1 - c0] for row, i in enumerate(missing)
            }
            h.stats["streamed_reads"] += len(missing)
            for i, v in views.items():
                if v is not None:
                    chunk[i] = v[c0 - a : c1 - a]
            if acc is not None:
                acc[...] += gram([[(c, chunk[i]) for c, i in row] for row in req.rows])
            else:
                assert out is not None
                for r, x in enumerate(part_combine(req.rows, chunk.__getitem__)):
                    out[r, c0 - a : c1 - a] = x
            h.stats["stream_compute_s"] += time.perf_counter() - r1

        for c0, c1 in zip(cuts, cuts[1:], strict=False):
            one(c0, c1)
    return (acc if acc is not None else out).tobytes()  # type: ignore[union-attr]


@dataclass
class RemoteParts:
    """The reducer's :class:`~flstore_workloads.sliced.Parts`: each range of the plan's
    ``slices`` from the function that computes it.

    Parameters
    ----------
    slices
        ``[{"bounds": [a, b], "part": [s, S] | null, "function": name, "endpoint": url |
        null}, ...]`` covering the models in order.
    objects
        The query's model ids.
    source
        The plan's ``source`` (ranges past the node's memory budget read from the cold
        store), or None.
    me
        This function's name: its own ranges are computed here.
    local
        Answers a ``/part`` body here (:func:`serve` on this function's holdings).
    remote
        ``remote(function, endpoint, body) -> bytes``: a ``/part`` on another function
        (raises on failure).
    stats
        The function's profile (:data:`PROFILE`), to which the wait for the parts is added.
    at_once
        Functions asked at once, at most (default :data:`PARTS_AT_ONCE`).
    """

    slices: Sequence[Mapping[str, Any]]
    objects: list[str]
    source: dict[str, Any] | None
    me: str
    local: Callable[[dict[str, Any]], bytes]
    remote: Callable[[str, str | None, dict[str, Any]], bytes]
    #: the function's profile (:data:`PROFILE`), or None
    stats: dict[str, float] | None = None
    #: functions asked at once, at most
    at_once: int = field(default_factory=lambda: PARTS_AT_ONCE)

    def _ask(
        self, op: str, rows: Sequence[RowSpec], span: tuple[int, int] | None = None
    ) -> list[bytes]:
        """Each range's answer, in order; given a ``span``, only the ranges that overlap it,
        each over the overlap."""
        bodies = []
        for s in self.slices:
            a, b = int(s["bounds"][0]), int(s["bounds"][1])
            lo, hi = (a, b) if span is None else (max(a, span[0]), min(b, span[1]))
            if lo >= hi:
                continue
            req = PartRequest(
                op,
                (a, b),
                None if s.get("part") is None else (int(s["part"][0]), int(s["part"][1])),
                self.objects,
                [list(r) for r in rows],
                self.source,
                None if (lo, hi) == (a, b) else (lo, hi),
                max(int(r["bounds"][1]) for r in self.slices),
            )
            bodies.append((s, req.to_json()))

        def one(item: tuple[Mapping[str, Any], dict[str, Any]]) -> bytes:
            s, body = item
            if s["function"] == self.me:
                return self.local(body)
            return self.remote(str(s["function"]), s.get("endpoint"), body)

        # each function's ranges one after the other (a function that streams several ranges
        # from the cold store holds one chunk at a time), and at most ``at_once`` functions at
        # a time, those that stream first (they take longest): the parts' products share the
        # node's cores, and ten functions computing at once on two took each several times
        # longer than one after the other (their blocks evicting each other from the caches)
        by_function: dict[str, list[int]] = {}
        for k, (s, _) in enumerate(bodies):
            by_function.setdefault(str(s["function"]), []).append(k)
        streams = {str(s["function"]) for s, _ in bodies if s.get("part") is None}
        order = sorted(by_function, key=lambda f: f not in streams)
        answers: list[bytes] = [b""] * len(bodies)

        def in_turn(ks: list[int]) -> None:
            for k in ks:
                answers[k] = one(bodies[k])

        workers = max(1, min(self.at_once, len(by_function)))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers, thread_name_prefix="part-ask") as pool:
            list(pool.map(in_turn, [by_function[f] for f in order]))
        if self.stats is not None:
            self.stats["reducer_parts_s"] += time.perf_counter() - t0
        return answers

    def gram(self, rows: Sequence[RowSpec]) -> NDArray[np.float64]:
        n = len(rows)
        out = np.zeros((n, n))
        for raw in self._ask("gram", rows):
            out += np.frombuffer(raw, dtype="<f8").reshape(n, n)
        return out

    def combine(
        self, rows: Sequence[RowSpec], span: tuple[int, int] | None = None
    ) -> list[NDArray[np.float32]]:
        n = len(rows)
        pieces = [
            np.frombuffer(raw, dtype="<f4").reshape(n, -1)
            for raw in self._ask("combine", rows, span)
        ]
        whole = np.concatenate(pieces, axis=1)
        return [whole[i] for i in range(n)]

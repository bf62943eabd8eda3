"""Queries whose models do not fit one cache function: placed and run in coordinate parts.

A query whose models (a round's updates and its base model, or a window of rounds) take more
than one function's capacity is placed as ``S`` parts (:func:`parts_needed`): function ``f_s``
holds part ``s`` of every model of the query (``ObjectKey.with_part``), one group per part,
placed like any objects (:meth:`~cache_engine.engine.CacheEngine.ensure`, one copy; the cold
store holds everything, so a lost part is read again). The functions on the node of a round's
root gateway map the parts in place from its store. The group of part 0 also holds the query's
metadata: its function is the query's reducer (``functions/flstore/parts.py``).

The policy still sees whole objects (P1-P4 carry over): the engine places the parts of what it
prefetches, and an object it evicts goes with all of its parts.

A part whose function holds all of it but a few objects (a round the policy placed, without
the base model a query adds; at most 1/:data:`PARTIAL_SHARE` of the queries' working memory
of them a query) is computed there,
those objects' slices read from the cold store (``/part`` streams what it does not hold).

Past the node's memory budget (:mod:`cache_engine.budget`), or when no function can take a
part, the query is not refused: the plan names live functions for coordinate ranges with a
``source`` (a read grant of the job), and each reads its range of every model from the cold
store a chunk at a time, keeping nothing (``/part``, streamed). The parts not held are joined
into at most :data:`STREAM_WORKERS` contiguous ranges, one function each: the queries' working
memory (``query_memory_bytes``) is shared among those few, so each reads large chunks
(``chunk_bytes``: fewer, larger ranged reads of every model, on MinIO's blocks) rather than
many functions small ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cache_engine.budget import OverBudget
from cache_engine.errors import EngineError, one_line
from cache_engine.keys import ObjectKey
from cache_engine.queries import Plan
from flstore_workloads.sliced import max_parts, part_bounds

if TYPE_CHECKING:
    from cache_engine.state import EngineState

log = logging.getLogger(__name__)

#: the share of a function's capacity one part of a query's models may take (two groups fit)
FILL = 0.5
#: functions that stream a query's ranges from the cold store at most: two, so that one
#: computes on its chunk while the other reads (on a node of 2 cores, MinIO's among them);
#: more would share the queries' working memory in smaller chunks, each a ranged read per model
#: (at 200 ResNet-18-sized updates, four functions read 667 KB at a time: 10,000 reads a query)
STREAM_WORKERS = 2
#: what one streaming function holds of the models at a time (``functions/flstore/parts.py``),
#: at least, and at most
STREAM_BYTES = 64 << 20
MAX_STREAM_BYTES = 512 << 20
#: the share of its part of the queries' working memory a streaming function fills with its
#: chunk; the rest is for the products' blocks and the allocator's slack
STREAM_FILL = 7 / 8
#: a part whose function holds all of it but a few objects (the base model the query adds to
#: a round the policy placed) is computed there, the function reading those objects' slices
#: from the cold store; at most this share of the queries' working memory of them a query (the
#: rest is for the ranges streamed whole)
PARTIAL_SHARE = 8


def parts_needed(models: int, model_bytes: int, capacity: int, dim: int) -> int:
    """The fewest parts, a power of two (so that the parts of two queries of one round
    coincide), for which one part of ``models`` models takes at most :data:`FILL` of a
    function's ``capacity``; at most :func:`max_parts` of ``dim``."""
    want = max(1, math.ceil(models * model_bytes / max(1.0, FILL * capacity)))
    return min(1 << (want - 1).bit_length(), max_parts(dim))


def groups(models: Sequence[ObjectKey], parts: int) -> list[list[ObjectKey]]:
    """Part ``s`` of every model, for each ``s``."""
    return [[k.with_part(s, parts) for k in models] for s in range(parts)]


def _consecutive(items: Sequence[int], k: int) -> list[list[int]]:
    """``items`` in ``k`` consecutive groups of near-equal size."""
    cuts = [len(items) * i // k for i in range(k + 1)]
    return [list(items[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _runs(items: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``items`` as runs of consecutive numbers: ``[(first, last), ...]``."""
    out: list[tuple[int, int]] = []
    for i in items:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


class PartPlanner:
    """The engine's placement and plans of queries over parts (see the module)."""

    def __init__(self, engine: EngineState) -> None:
        self.e = engine
        #: per job: the models' length in floats, and their tensors (names, shapes)
        self.dims: dict[str, int] = {}
        self.layouts: dict[str, list[list[Any]]] = {}
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="engine-parts")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def too_big(self, keys: Sequence[ObjectKey]) -> bool:
        """Whether ``keys`` together take more than one function's capacity."""
        return sum(self.e._size(k) for k in keys) > self.e.s.function_capacity_bytes

    def dim(self, job: str, model: ObjectKey) -> int:
        """The job's models' length in floats (read once from a model's header)."""
        if job not in self.dims:
            index = self.e.cold.header(model.whole)
            self.dims[job] = index.numel
            self.layouts[job] = [[n, list(s)] for n, s in index.layout()]
        return self.dims[job]

    def covered(self, models: Sequence[ObjectKey]) -> int | None:
        """The number of parts in which most of the query's parts are held, each held part's
        group on one live function (under the engine's lock); None when no group is held."""
        if not models:
            return None
        counts = {k.parts for k in self.e.table.parts_of(models[0].whole)}
        best, most = None, 0
        for n in sorted(counts):
            held = sum(self._holder(g) is not None for g in groups(models, n))
            if held > most:
                best, most = n, held
        return best

    def _holder(self, group: Sequence[ObjectKey]) -> str | None:
        live = self.e._live_holders(group)
        return live[0] if live else None

    def _most(self, group: Sequence[ObjectKey]) -> tuple[str, int] | None:
        """The live function holding most of ``group`` (each key as its part, or the whole
        object it is part of), and the bytes of the rest; None when no live function holds any
        (under the engine's lock)."""
        counts: dict[str, int] = {}
        for k in group:
            if k in self.e._inflight:
                continue
            for f in set(self.e.table.get(k)) | set(self.e.table.get(k.whole)):
                counts[f] = counts.get(f, 0) + 1
        live = [f for f in counts if (i := self.e.functions.get(f)) is not None and i.alive]
        if not live:
            return None
        f = max(live, key=lambda x: (counts[x], x))
        rest = sum(
            self.e._size(k)
            for k in group
            if f not in self.e.table.get(k) and f not in self.e.table.get(k.whole)
        )
        return f, rest

    # -- acquiring ----------------------------------------------------------------------
    def acquire(self, p: Plan) -> dict[str, Any]:
        """A plan over parts for ``p``: its parts placed where the budget allows (now, or
        already), each range beyond read from the cold store by a live function; all of it
        streamed when no part could be placed."""
        models = [k for k in p.keys if k.kind != "meta"]
        metas = [k for k in p.keys if k.kind == "meta"]
        job = p.query.job
        dim = self.dim(job, models[0])
        with self.e._lock:
            n = self.covered(models)
        if n is None:
            n = parts_needed(
                len(models), self.e._size(models[0].whole), self.e.s.function_capacity_bytes, dim
            )
        gs = groups(models, n)
        with self.e._lock:
            missing = [s for s, g in enumerate(gs) if self._holder(g) is None]
        why = self.place(models, metas, n, missing) if missing else ""
        room = self.working_room()  # (it may ask functions: not under the engine's lock)
        with self.e._lock:
            holders: list[str | None] = [self._holder(g) for g in gs]
            # a part held but for a few objects (the round's base model, whose part the budget
            # had no room for): its function reads those from the cold store, not the range
            partial: dict[int, int] = {}
            left = room // PARTIAL_SHARE
            for s, g in enumerate(gs):
                most = self._most(g) if holders[s] is None else None
                if most is not None and most[1] <= left:
                    holders[s], partial[s] = most[0], most[1]
                    left -= most[1]
        if not any(holders):
            return self.stream(p, models, metas, dim, why or "every part was lost")
        try:  # the reducer: part 0's holder, with the metadata
            whole0 = holders[0] is not None and 0 not in partial
            reducer = self.e.ensure(gs[0] + metas, copies=1)[0] if whole0 else None
        except (OverBudget, EngineError):
            reducer = None
        reducer = reducer or next(h for h in holders if h)
        unplaced = [s for s, h in enumerate(holders) if h is None]
        bounds = part_bounds(dim, n)
        ranges: list[dict[str, Any]] = [
            {"bounds": list(b), "part": [s, n], "function": h}
            for s, (b, h) in enumerate(zip(bounds, holders, strict=True))
            if h is not None
        ]
        source: dict[str, Any] | None = None
        if unplaced or partial:  # past the budget: those ranges (objects) from the cold store
            log.info(
                "query %s on %s reads %d of %d parts from the cold store, and %d bytes of %d "
                "parts held but for those (%s)",
                p.query.workload,
                job,
                len(unplaced),
                n,
                sum(partial.values()),
                len(partial),
                why,
            )
            workers, each = self._streamers(None, taken=sum(partial.values()))
            workers = workers or [str(reducer)]
            k = max(1, min(len(workers), len(unplaced)))
            for w, some in zip(
                workers, _consecutive(unplaced, k) if unplaced else [], strict=False
            ):
                for first, last in _runs(some):
                    ranges.append(
                        {
                            "bounds": [bounds[first][0], bounds[last][1]],
                            "part": None,
                            "function": w,
                        }
                    )
            ranges.sort(key=lambda r: r["bounds"][0])
            source = {"credentials": self.e.cold.job_credentials({job}), "chunk_bytes": each}
            self.e.stats["queries_partly_streamed"] += 1
        else:
            self.e.stats["queries_in_parts"] += 1
        return self._plan(job, str(reducer), dim, ranges, source)

    def working_room(self) -> int:
        """The queries' working memory the budget has now
        (:meth:`~cache_engine.budget.MemoryBudget.working_room`), the functions that last
        reported while busy asked again first: after a round's loads their resting figures are
        estimates that miss what the loads cost beyond the objects' bytes (a ping finds them at
        rest, or they count with all their private memory)."""
        with self.e._lock:
            alive = {f for f, i in self.e.functions.items() if i.alive}
        for f in self.e.budget.unsettled():
            if f in alive:
                self.e._ping(f)
        return self.e.budget.working_room()

    def _streamers(self, first: str | None, taken: int = 0) -> tuple[list[str], int]:
        """Live functions to read ranges from the cold store (``first`` first), as many as the
        queries' working memory (and what loads left of the budget) gives :data:`STREAM_BYTES`
        each, at most :data:`STREAM_WORKERS`; and the bytes each reads at a time:
        :data:`STREAM_FILL` of its share of that memory (a function reads its ranged reads
        straight into one chunk it reuses, ``functions/flstore/parts.py``). The same functions
        query after query (by name): each keeps the models' tensor indexes it read. ``taken``:
        bytes of that memory other functions of the query read already (parts held but for a
        few objects)."""
        room = max(0, self.working_room() - taken)
        with self.e._lock:
            alive = sorted(f for f, i in self.e.functions.items() if i.alive and f != first)
        workers = ([first] if first else []) + alive
        workers = workers[: max(1, min(STREAM_WORKERS, room // STREAM_BYTES))]
        share = room // max(1, len(workers))
        each = min(MAX_STREAM_BYTES, max(STREAM_BYTES, int(share * STREAM_FILL)))
        return workers, each

    def place(
        self,
        models: Sequence[ObjectKey],
        metas: Sequence[ObjectKey],
        n: int,
        only: Sequence[int] | None = None,
    ) -> str:
        """Place part ``s`` of every model on a function, for each ``s`` (of ``only``; the
        metadata with part 0), each group as the node's memory budget allows (checked before
        its load starts; the policy's order frees room first). Returns why a group was not
        placed ("" when all were)."""
        gs = groups(models, n)
        gs[0] = gs[0] + list(metas)
        todo = [gs[s] for s in (range(n) if only is None else only)]
        futs = [self._pool.submit(self.e.ensure, g, 1) for g in todo]
        why = ""
        for fut in futs:
            try:
                fut.result()
                self.e.stats["parts_placed"] += 1
            except (OverBudget, EngineError) as exc:
                why = why or one_line(exc)
        return why

    def stream(
        self,
        p: Plan,
        models: Sequence[ObjectKey],
        metas: Sequence[ObjectKey],
        dim: int,
        why: str,
    ) -> dict[str, Any]:
        """A plan whose functions read their ranges of the models from the cold store."""
        log.info(
            "query %s on %s reads its models from the cold store (%s)",
            p.query.workload,
            p.query.job,
            why,
        )
        self.e.stats["queries_streamed"] += 1
        try:  # the metadata is small: held by the reducer where the budget allows
            reducer = self.e.ensure(list(metas), copies=1)[0] if metas else None
        except (OverBudget, EngineError):
            reducer = None  # it reads it from the cold store too
        reducer = reducer or self.e.any_function()
        workers, each = self._streamers(reducer)
        bounds = part_bounds(dim, min(len(workers), max_parts(dim)))
        ranges = [
            {"bounds": list(b), "part": None, "function": f}
            for b, f in zip(bounds, workers, strict=False)
        ]
        grant = self.e.cold.job_credentials({p.query.job})
        source = {"credentials": grant, "chunk_bytes": each}
        return self._plan(p.query.job, reducer, dim, ranges, source)

    def _plan(
        self,
        job: str,
        reducer: str,
        dim: int,
        ranges: list[dict[str, Any]],
        source: dict[str, Any] | None,
    ) -> dict[str, Any]:
        with self.e._lock:
            urls = {f: i.url for f, i in self.e.functions.items() if i.url}
        for r in ranges:
            r["endpoint"] = urls.get(r["function"])
        slices: dict[str, Any] = {"dim": dim, "ranges": ranges}
        if source is not None:
            slices["source"] = source
        return {
            "holders": [reducer],
            "endpoints": {reducer: urls[reducer]} if reducer in urls else {},
            "slices": slices,
            "layout": self.layouts.get(job),
        }

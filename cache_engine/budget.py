"""The cache engine's account of the node's memory budget (:mod:`cache_engine.node_memory`).

The budget is one per node, shared with the node gateway's store. The account covers:

- the node gateways' shared-memory store, as the memory file system counts it
  (:func:`~cache_engine.node_memory.store_bytes` of the engine's ``store_root``): the round's
  updates under aggregation, the globals, the buffers kept for reuse, and the updates a round's
  offer or a cache function's lease keeps there;
- the store pages FLStore keeps alive, where the engine has no ``store_root`` to read (its
  node's store is out of its reach: a Kubernetes pod): the updates a gateway offers for a round
  until the offer ends, and those a cache function maps in place. With a ``store_root`` these
  are pages of the store, counted there and not again;
- the cache functions' private memory (each reports its ``RssAnon``: the objects it read from
  the cold store, the interpreter, and the working memory of the requests it serves);
- loads under way (reserved before they start, so two loads at once never pass it together);
- room kept for the queries' own working memory (``query_memory_bytes``: a reducer's batch of
  sub-models, the chunks a function streams from the cold store), never filled by loads.

A load that would pass the budget does not start: the engine frees room by its policy's
eviction order, and failing that the query reads its models from the cold store through the
cache functions a range at a time (``cache_engine.parts``), keeping nothing. The store comes
first: it may grow into what FLStore holds (its uploads are refused only past the whole budget),
and the engine then gives that memory back, evicting in its policy's order
(:meth:`MemoryBudget.overdraft`, checked every ping round).

The queries' working memory is what ``query_memory_bytes`` is kept for, so it never makes the
engine give memory back: each function also reports its resting memory (``resting_bytes``,
``functions/flstore/memory.py``: its ``RssAnon`` with no request under way, moved by what it
loaded and evicted since), and the account gives back what the resting memory passes the loads'
share by, or what the whole account passes the budget by. A load fits the loads' share with
what is used now (a query's working memory under way too: loads wait for it).

The room a query's working memory is given (:meth:`MemoryBudget.working_room`) counts a
function's resting memory only where the function read it at rest (no request under way when
it answered): a resting figure it answered while busy (a load's or an eviction's answer, a ping
during a query) is its last idle reading moved by the bytes it loaded since, which misses what
the loads cost beyond those bytes (imports, clients, the evaluator a round's metadata warms)
and any other request's working memory. Such a function counts with all of its private
memory, and the engine asks it again (a ping) before it plans a query's working memory
(``cache_engine.parts``): planned on the estimate, a query streamed right after the round's
loads was given more than the budget had left, and the functions' memory passed the budget.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _no_store() -> int:
    return 0


#: the share of the queries' working memory (``keep``) the resting memory may pass the loads'
#: share by before the engine gives memory back (:meth:`MemoryBudget.overdraft`)
SLACK = 1 / 8


class OverBudget(Exception):
    """A load that would pass the node's memory budget."""


@dataclass
class MemoryBudget:
    """The node's budget and what counts against it (see the module); thread-safe.

    Parameters
    ----------
    limit
        The node's budget, in bytes (:func:`~cache_engine.node_memory.node_budget`).
    keep
        Bytes of it loads never take: the queries' working memory.
    store
        Reads the bytes the node's store holds now; ``None``: the store is out of the
        engine's reach, and the leases count the store pages FLStore keeps instead.
    """

    limit: int
    keep: int = 0
    store: Callable[[], int] | None = None
    #: each cache function's private memory, as it last reported it
    private: dict[str, int] = field(default_factory=dict)
    #: each cache function's resting memory: its private memory less its requests' working
    #: memory, as it last reported it
    resting: dict[str, int] = field(default_factory=dict)
    #: the functions whose last report was read with a request under way: their resting
    #: figure is an estimate (see the module)
    busy: set[str] = field(default_factory=set)
    #: store objects kept for FLStore (an offered or mapped update) -> their bytes
    leased: dict[str, int] = field(default_factory=dict)
    #: bytes of loads under way
    reserved: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def used(self) -> int:
        """Bytes counted now."""
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return self._flstore() + self._store()

    def _store(self) -> int:
        return (self.store or _no_store)()

    def _flstore(self, functions: dict[str, int] | None = None) -> int:
        """What FLStore holds beyond the store's own count, its functions' memory as
        ``functions`` says (default: their private memory; under the lock)."""
        leased = 0 if self.store is not None else sum(self.leased.values())
        return sum((self.private if functions is None else functions).values()) + (
            leased + self.reserved
        )

    def _resting(self) -> int:
        """:meth:`_used` without the requests' working memory (under the lock)."""
        return self._flstore(self.resting) + self._store()

    def _measured(self, functions: dict[str, int]) -> int:
        """What the node holds now, the functions' memory as ``functions`` says: loads under
        way are in it as far as their bytes arrived, and not counted again as reserved (under
        the lock)."""
        return self._flstore(functions) - self.reserved + self._store()

    def room(self) -> int:
        """Bytes loads may still take (0 when past it): the budget less what is used (the
        queries' working memory under way too) and the queries' working memory kept."""
        with self._lock:
            return max(0, self.limit - self.keep - self._used())

    def working_room(self) -> int:
        """Bytes the queries' working memory may take now: the budget less the resting
        memory (``keep``, or less where the resting memory passed the loads' share), a
        function that reported while busy counted with all of its private memory (see the
        module)."""
        with self._lock:
            known = {f: self.private[f] if f in self.busy else r for f, r in self.resting.items()}
            return max(0, self.limit - self._flstore(known) - self._store())

    def unsettled(self) -> list[str]:
        """The functions whose last report was read with a request under way (see the
        module): the engine asks them again before it plans a query's working memory."""
        with self._lock:
            return sorted(self.busy)

    def overdraft(self) -> int:
        """Bytes the account is past what it may hold (0 when within): the resting memory
        past the loads' share by more than :data:`SLACK` of ``keep`` (the store grew into
        FLStore's share, or a function's memory did), or the whole account past the budget;
        the engine evicts to give them back. The queries' working memory within ``keep`` is
        no overdraft, and neither is what a load costs beyond its objects' bytes (a
        function's first loads import and warm its cold store client): evicting for that
        would start evict-and-load-again turns with the next query. Measured memory only: a
        load under way is reserved (for the loads that would start) and, as its bytes arrive,
        in its function's memory; counted twice, it would evict what is being loaded."""
        with self._lock:
            share = self.limit - self.keep + int(SLACK * self.keep)
            return max(
                0,
                self._measured(self.resting) - share,
                self._measured(self.private) - self.limit,
            )

    def reserve(self, nbytes: int) -> None:
        """Count a load of ``nbytes`` before it starts; :class:`OverBudget` if it does not
        fit. Give it back with :meth:`unreserve` once the function reported its memory."""
        with self._lock:
            used = self._used()
            if nbytes > 0 and used + nbytes > self.limit - self.keep:
                raise OverBudget(
                    f"{nbytes} bytes more would pass the node's memory budget "
                    f"({used} of {self.limit} bytes used, {self._resting()} of them at rest, the "
                    f"store's {self._store()} among them; {self.keep} kept for queries' "
                    "working memory)"
                )
            self.reserved += max(0, nbytes)

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self.reserved = max(0, self.reserved - max(0, nbytes))

    def report(
        self,
        function: str,
        private_bytes: int,
        resting_bytes: int | None = None,
        requests_under_way: int = 0,
    ) -> None:
        """A cache function's private memory, and its resting part (default: all of it), as
        it reported them, with the requests it served as it read them (its resting figure an
        estimate where any were: see the module)."""
        with self._lock:
            private = max(0, int(private_bytes))
            self.private[function] = private
            rest = private if resting_bytes is None else int(resting_bytes)
            self.resting[function] = min(private, max(0, rest))
            if requests_under_way > 0:
                self.busy.add(function)
            else:
                self.busy.discard(function)

    def report_answer(
        self, function: str, answer: Mapping[str, Any], private_default: int = 0
    ) -> None:
        """:meth:`report` from a cache function's JSON answer (a ping's, a load's, an
        eviction's: ``private_bytes``, ``resting_bytes``, ``requests_under_way``);
        ``private_default`` where it names no ``private_bytes``."""
        self.report(
            function,
            int(answer.get("private_bytes", private_default)),
            answer.get("resting_bytes"),
            int(answer.get("requests_under_way") or 0),
        )

    def forget_function(self, function: str) -> None:
        with self._lock:
            self.private.pop(function, None)
            self.resting.pop(function, None)
            self.busy.discard(function)

    def lease(self, objects: Iterable[tuple[str, int]]) -> None:
        """Store objects FLStore keeps (an offer's updates, updates mapped in place)."""
        with self._lock:
            for ident, nbytes in objects:
                self.leased[ident] = int(nbytes)

    def unlease(self, idents: Iterable[str]) -> None:
        with self._lock:
            for ident in idents:
                self.leased.pop(ident, None)

    def describe(self) -> dict[str, int | bool]:
        """The account: ``used_bytes`` is ``store_bytes`` + ``functions_bytes`` +
        ``reserved_bytes``, + ``leased_bytes`` only where the store is not read
        (``store_counted`` false); ``functions_resting_bytes``, the functions' memory less
        their requests' working memory."""
        with self._lock:
            store = self._store()
            return {
                "limit_bytes": self.limit,
                "kept_for_queries_bytes": self.keep,
                "used_bytes": self._flstore() + store,
                "store_bytes": store,
                "store_counted": self.store is not None,
                "functions_bytes": sum(self.private.values()),
                "functions_resting_bytes": sum(self.resting.values()),
                "functions_busy": len(self.busy),
                "leased_bytes": sum(self.leased.values()),
                "reserved_bytes": self.reserved,
            }

"""One memory budget per node for what FLStore holds there.

The budget covers, on the cache engine's node:

- the cache functions' private memory (each reports its ``RssAnon``: the objects it read from
  the cold store, and the interpreter);
- the store pages FLStore keeps alive: the updates a gateway offers for a round until the
  offer ends, and those a cache function maps in place (its lease keeps them in the store):
  each update counted once, however many functions map it or parts of it;
- loads under way (reserved before they start, so two loads at once never pass it together);
- room kept for the queries' own working memory (``query_memory_bytes``: a reducer's batch of
  sub-models, the chunks a function streams from the cold store), never filled by loads.

A load that would pass the budget does not start: the engine frees room by its policy's
eviction order, and failing that the query reads its models from the cold store through the
cache functions a range at a time (``cache_engine.parts``), keeping nothing. The default is
:data:`DEFAULT_FRACTION` of the node's memory (its cgroup limit where lower); the engine's
setting ``memory_budget_bytes`` fixes it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: the share of the node's memory FLStore may use by default
DEFAULT_FRACTION = 0.5


def node_memory(
    meminfo: Path = Path("/proc/meminfo"),
    cgroup: Path = Path("/sys/fs/cgroup/memory.max"),
) -> int:
    """Bytes of memory this node gives this process: ``MemTotal``, or the cgroup's limit where
    that is lower."""
    total = 0
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
            break
    try:
        raw = cgroup.read_text().strip()
    except OSError:
        raw = "max"
    if raw.isdigit() and 0 < int(raw) < total:
        return int(raw)
    return total


def default_budget(fraction: float = DEFAULT_FRACTION) -> int:
    """:data:`DEFAULT_FRACTION` (or ``fraction``) of :func:`node_memory`."""
    return int(node_memory() * fraction)


class OverBudget(Exception):
    """A load that would pass the node's memory budget."""


@dataclass
class MemoryBudget:
    """The node's budget and what counts against it (see the module); thread-safe.

    Parameters
    ----------
    limit
        Bytes FLStore may use on the node.
    keep
        Bytes of it loads never take: the queries' working memory.
    """

    limit: int
    keep: int = 0
    #: each cache function's private memory, as it last reported it
    private: dict[str, int] = field(default_factory=dict)
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
        return sum(self.private.values()) + sum(self.leased.values()) + self.reserved

    def room(self) -> int:
        """Bytes loads may still take (0 when past it): the budget less what is used and
        the queries' working memory."""
        with self._lock:
            return max(0, self.limit - self.keep - self._used())

    def reserve(self, nbytes: int) -> None:
        """Count a load of ``nbytes`` before it starts; :class:`OverBudget` if it does not
        fit. Give it back with :meth:`unreserve` once the function reported its memory."""
        with self._lock:
            if nbytes > 0 and self._used() + nbytes > self.limit - self.keep:
                raise OverBudget(
                    f"{nbytes} bytes more would pass the node's memory budget "
                    f"({self._used()} of {self.limit} bytes used, {self.keep} kept for "
                    "queries' working memory)"
                )
            self.reserved += max(0, nbytes)

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self.reserved = max(0, self.reserved - max(0, nbytes))

    def report(self, function: str, private_bytes: int) -> None:
        """A cache function's private memory, as it reported it."""
        with self._lock:
            self.private[function] = max(0, int(private_bytes))

    def forget_function(self, function: str) -> None:
        with self._lock:
            self.private.pop(function, None)

    def lease(self, objects: Iterable[tuple[str, int]]) -> None:
        """Store objects FLStore keeps (an offer's updates, updates mapped in place)."""
        with self._lock:
            for ident, nbytes in objects:
                self.leased[ident] = int(nbytes)

    def unlease(self, idents: Iterable[str]) -> None:
        with self._lock:
            for ident in idents:
                self.leased.pop(ident, None)

    def describe(self) -> dict[str, int]:
        with self._lock:
            return {
                "limit_bytes": self.limit,
                "kept_for_queries_bytes": self.keep,
                "used_bytes": self._used(),
                "functions_bytes": sum(self.private.values()),
                "leased_bytes": sum(self.leased.values()),
                "reserved_bytes": self.reserved,
            }

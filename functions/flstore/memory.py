"""A cache function's private memory as the node's memory budget counts it.

``private_bytes`` is the process's ``RssAnon`` now: the interpreter, the objects it read from
the cold store, and, while it serves a request, that request's working memory (a query's
sub-models and products, a streamed chunk, a load's buffers). The budget keeps room for the
queries' working memory (``query_memory_bytes``), so the engine must not take that memory for
objects held: ``resting_bytes`` is what the function would hold with no request under way, the
``RssAnon`` read the last time none was (its interpreter and objects), moved by the objects it
loaded or evicted since. The engine gives memory back to the node's store by that figure
(``cache_engine.budget``), so a query's working memory never evicts the objects it reads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


def rss_anon() -> int | None:
    """This process's private memory (``RssAnon``, bytes); None where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PrivateMemory:
    """The function's private memory, and its resting part (see the module).

    Parameters
    ----------
    private
        Reads the private memory now (``RssAnon``).
    held
        Reads the bytes of the objects held in private memory (not those mapped from a
        gateway's store, which are the store's pages).
    """

    def __init__(self, private: Callable[[], int], held: Callable[[], int]) -> None:
        self._private = private
        self._held = held
        self._lock = threading.Lock()
        #: requests under way (``/load``, ``/evict``, ``/run``, ``/part``)
        self._busy = 0
        #: the private memory and the held bytes when last read with no request under way
        self._rest: tuple[int, int] | None = None

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """One request under way: its working memory is not resting memory."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1

    def status(self) -> dict[str, Any]:
        """``private_bytes`` (now), ``resting_bytes`` (see the module, at most the former) and
        ``requests_under_way``."""
        private = self._private()
        held = self._held()
        with self._lock:
            busy = self._busy
            if busy == 0:
                self._rest = (private, held)
            rest = self._rest
        resting = private if rest is None else rest[0] + held - rest[1]
        return {
            "private_bytes": private,
            "resting_bytes": max(0, min(private, resting)),
            "requests_under_way": busy,
        }

"""Memory that request bodies hold: the node's budget, and the job-creation body's spool.

Every body the gateway keeps while it arrives takes its bytes from one per-node
:class:`MemoryBudget` (``GatewaySettings.max_inflight_bytes``) *before* anything is allocated:
an upload its store object, a cross-node partial its object, a JSON body its (bounded) bytes,
the job-creation body each span as it arrives. Past the budget the request is answered
503 with ``Retry-After`` and nothing is allocated. Bodies the gateway refuses or never asks
for are never read into memory (``gateway.http``).
"""

from __future__ import annotations

import mmap
import os

from gateway.errors import Overloaded

#: seconds a client is told to wait when the budget is spent
RETRY_AFTER_S = 1


class MemoryBudget:
    """Bytes of request bodies held at once on this node; ``limit`` 0 means no limit."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.used = 0
        self.peak = 0
        self.refused = 0

    def reserve(self, n: int, what: str) -> Hold:
        """Take ``n`` bytes for ``what`` (words for the error), or raise :class:`Overloaded`."""
        hold = Hold(self, what)
        hold.grow(n)
        return hold

    def _take(self, n: int, what: str) -> None:
        if self.limit and self.used + n > self.limit:
            self.refused += 1
            raise Overloaded(
                f"{what} needs {n} bytes but this node holds {self.used} of its {self.limit}-byte "
                f"budget for request bodies in flight (max_inflight_bytes); retry after "
                f"{RETRY_AFTER_S} s",
                retry_after=RETRY_AFTER_S,
            )
        self.used += n
        self.peak = max(self.peak, self.used)


class Hold:
    """Bytes one request holds in a :class:`MemoryBudget`; ``release`` gives them all back."""

    def __init__(self, budget: MemoryBudget, what: str) -> None:
        self.budget, self.what, self.nbytes = budget, what, 0

    def grow(self, n: int) -> None:
        """Take ``n`` more bytes (raises :class:`Overloaded`, holding what it held)."""
        if n > 0:
            self.budget._take(n, self.what)
            self.nbytes += n

    def release(self) -> None:
        """Give every held byte back (a second call does nothing)."""
        self.budget.used -= self.nbytes
        self.nbytes = 0


class SpooledBody:
    """A body of known length received into anonymous shared memory (``memfd``), not the heap.

    Pages are allocated only as bytes arrive, so an announced but unsent body costs nothing;
    ``view`` is where the server receives into (one copy, the kernel's) and what the caller
    reads afterwards. ``close`` frees the pages.
    """

    def __init__(self, nbytes: int, name: str = "fedfaas-body") -> None:
        self.nbytes = nbytes
        self._mm: mmap.mmap | None = None
        self.view = memoryview(b"")
        if nbytes:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
            finally:
                os.close(fd)
            self.view = memoryview(self._mm)

    def close(self) -> None:
        view, self.view = self.view, memoryview(b"")
        mm, self._mm = self._mm, None
        try:
            view.release()
            if mm is not None:
                mm.close()
        except BufferError:  # a view of it is still alive somewhere: its pages go with it
            pass

    def __enter__(self) -> SpooledBody:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

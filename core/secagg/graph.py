"""SecAgg+'s neighbour graph: clients on a ring, each with ``k / 2`` neighbours on each side.

The ring's order is a permutation of the clients fixed by the round's public ``context``
(SHA-256 of the context and the client id), so the server and every client compute the same
graph and nobody picks their own neighbours. ``k >= n - 1`` connects everyone (SecAgg).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def ring(clients: Iterable[str], context: bytes) -> list[str]:
    """The clients in ring order for ``context``."""
    return sorted(set(clients), key=lambda c: hashlib.sha256(context + c.encode()).digest())


def neighbours(clients: Iterable[str], degree: int, context: bytes) -> dict[str, list[str]]:
    """Each client's neighbours (sorted), ``degree`` of them (``n - 1`` at most)."""
    order = ring(clients, context)
    n = len(order)
    if degree >= n - 1:
        return {c: sorted(set(order) - {c}) for c in order}
    if degree % 2 or degree < 2:
        raise ValueError(f"degree must be even and >= 2 below n - 1, not {degree}")
    half = degree // 2
    return {
        c: sorted({order[(i + d) % n] for d in range(-half, half + 1) if d})
        for i, c in enumerate(order)
    }

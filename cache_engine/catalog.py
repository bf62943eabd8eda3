"""What exists in the cold store: rounds written per job and the clients of each round.

Policies consult a catalog to know what to prefetch (the next round's clients, a client's previous
and next participation). :class:`MemoryCatalog` is the pure in-process implementation; the engine
keeps one mirrored from Redis.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Protocol


class Catalog(Protocol):
    """Read-only view of the rounds that are written (complete) in the cold store."""

    def rounds(self, job: str) -> Sequence[int]:
        """Complete rounds of ``job``, ascending."""
        ...

    def clients(self, job: str, rnd: int) -> Sequence[str]:
        """Clients whose updates round ``rnd`` holds (empty if the round is unknown)."""
        ...

    def client_rounds(self, job: str, client: str) -> Sequence[int]:
        """Rounds in which ``client`` took part, ascending."""
        ...


class MemoryCatalog:
    """A :class:`Catalog` held in memory; rounds are added as they complete."""

    def __init__(self) -> None:
        self._rounds: dict[str, list[int]] = {}
        self._clients: dict[tuple[str, int], tuple[str, ...]] = {}
        self._by_client: dict[tuple[str, str], list[int]] = {}

    def add_round(self, job: str, rnd: int, clients: Iterable[str]) -> None:
        """Record that round ``rnd`` of ``job`` is complete with ``clients``' updates."""
        key = (job, rnd)
        cl = tuple(sorted(set(clients)))
        if key in self._clients:
            for c in self._clients[key]:
                lst = self._by_client[(job, c)]
                lst.remove(rnd)
        else:
            bisect.insort(self._rounds.setdefault(job, []), rnd)
        self._clients[key] = cl
        for c in cl:
            bisect.insort(self._by_client.setdefault((job, c), []), rnd)

    def jobs(self) -> list[str]:
        return sorted(self._rounds)

    def has_round(self, job: str, rnd: int) -> bool:
        return (job, rnd) in self._clients

    def rounds(self, job: str) -> Sequence[int]:
        return self._rounds.get(job, [])

    def latest(self, job: str) -> int | None:
        r = self._rounds.get(job)
        return r[-1] if r else None

    def clients(self, job: str, rnd: int) -> Sequence[str]:
        return self._clients.get((job, rnd), ())

    def client_rounds(self, job: str, client: str) -> Sequence[int]:
        return self._by_client.get((job, client), [])


def neighbour_rounds(rounds: Sequence[int], rnd: int) -> tuple[int | None, int | None]:
    """The rounds just before and just after ``rnd`` in the ascending list ``rounds``."""
    i = bisect.bisect_left(rounds, rnd)
    prev = rounds[i - 1] if i > 0 else None
    j = i + 1 if i < len(rounds) and rounds[i] == rnd else i
    nxt = rounds[j] if j < len(rounds) else None
    return prev, nxt

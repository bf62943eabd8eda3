"""Caching policies as pure classes: FLStore's tailored P1-P4 and the classic baselines.

Every policy keeps the set of resident objects (bounded by ``capacity`` objects) and answers
``on_request(keys) -> Decision(hits, misses, prefetch, evict)``: which of the requested keys were
resident, which must be loaded, what to load ahead of time and what to drop. The caller carries the
decision out; the policy assumes it was. ``on_round_complete(job, round)`` tells the policy that a
new round is written (ingestion), so policies that keep hot data can ask for it.

Tailored policies (FLStore paper, section 4.4):

- **P1** single client or global model: cache what is asked; keep the latest global model.
- **P2** all updates of a round: load the whole round and the next, evict older rounds (but the
  global model the previous round started from), keep the latest round.
- **P3** one client across rounds: load the client's previous and next participation, evict
  that client's older rounds.
- **P4** metadata of the last ``R`` rounds (``R = 10``), loaded as rounds complete.

Baselines: LRU, FIFO, LFU (admit on miss, no prefetch), ``random`` (FLStore-Random from the
paper's ablation: a tailored policy picked at random per request) and ``static`` (FLStore-Static:
always P1, whatever the workload).
"""

from __future__ import annotations

import bisect
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cache_engine.catalog import Catalog, neighbour_rounds
from cache_engine.keys import ObjectKey, global_model, meta, update

TAILORED = ("P1", "P2", "P3", "P4")


@dataclass
class Decision:
    """What a policy decided for one request or one completed round."""

    hits: list[ObjectKey] = field(default_factory=list)
    misses: list[ObjectKey] = field(default_factory=list)
    prefetch: list[ObjectKey] = field(default_factory=list)
    evict: list[ObjectKey] = field(default_factory=list)

    @property
    def hit(self) -> bool:
        """Whether the whole request was served from the cache."""
        return not self.misses


@dataclass
class _Entry:
    inserted: int
    last: int
    count: int = 0


class Policy(ABC):
    """A cache policy over a bounded set of resident objects.

    Parameters
    ----------
    capacity
        Most objects resident at once (>= 1).
    catalog
        What exists in the cold store (for prefetching).
    """

    name = "policy"

    def __init__(self, capacity: int, catalog: Catalog, *, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.catalog = catalog
        self._res: dict[ObjectKey, _Entry] = {}
        self._tick = 0
        self._rng = random.Random(seed)

    # -- public API -------------------------------------------------------------------------
    def contents(self) -> frozenset[ObjectKey]:
        """Objects resident now."""
        return frozenset(self._res)

    def __contains__(self, key: object) -> bool:
        return key in self._res

    def __len__(self) -> int:
        return len(self._res)

    def on_request(self, keys: Sequence[ObjectKey], hint: str | None = None) -> Decision:
        """Serve one request for ``keys``; ``hint`` names the tailored policy (P1-P4) if known."""
        keys = list(dict.fromkeys(keys))
        d = Decision()
        for k in keys:
            self._tick += 1
            e = self._res.get(k)
            if e is None:
                d.misses.append(k)
                self._res[k] = _Entry(self._tick, self._tick, 1)
            else:
                d.hits.append(k)
                e.last = self._tick
                e.count += 1
        want, drop = self._plan(keys, hint)
        self._apply(d, want, drop, protected=set(keys))
        return d

    def on_round_complete(self, job: str, rnd: int) -> Decision:
        """A round was written; return hot data to load and data to drop."""
        d = Decision()
        want, drop = self._on_round(job, rnd)
        self._apply(d, want, drop, protected=set())
        return d

    def eviction_order(self, keys: Iterable[ObjectKey]) -> list[ObjectKey]:
        """``keys`` in the order this policy would evict them (non-resident ones first)."""

        def rank(k: ObjectKey) -> tuple[float, ...]:
            e = self._res.get(k)
            return (-1.0,) if e is None else self._rank(k, e)

        return sorted(keys, key=rank)

    def forget(self, keys: Iterable[ObjectKey]) -> None:
        """Drop ``keys`` from the resident set (they were lost, e.g. a cache function died)."""
        for k in keys:
            self._res.pop(k, None)

    # -- hooks ------------------------------------------------------------------------------
    def _plan(
        self, keys: list[ObjectKey], hint: str | None
    ) -> tuple[list[ObjectKey], list[ObjectKey]]:
        """Prefetch wishes and explicit evictions for a request (baselines: none)."""
        return [], []

    def _on_round(self, job: str, rnd: int) -> tuple[list[ObjectKey], list[ObjectKey]]:
        return [], []

    @abstractmethod
    def _rank(self, key: ObjectKey, e: _Entry) -> tuple[float, ...]:
        """Eviction order: the resident object with the smallest rank goes first."""

    # -- mechanics --------------------------------------------------------------------------
    def _apply(
        self, d: Decision, want: list[ObjectKey], drop: list[ObjectKey], protected: set[ObjectKey]
    ) -> None:
        for k in dict.fromkeys(drop):
            if k in self._res and k not in protected:
                del self._res[k]
                d.evict.append(k)
        self._shrink(d, protected)
        for k in dict.fromkeys(want):
            if k in self._res:
                continue
            if len(self._res) >= self.capacity and not self._shrink(d, protected | {k}, room=1):
                break
            self._tick += 1
            self._res[k] = _Entry(self._tick, self._tick, 0)
            d.prefetch.append(k)
            protected = protected | {k}

    def _shrink(self, d: Decision, protected: set[ObjectKey], room: int = 0) -> bool:
        """Evict until ``room`` slots are free; False if only protected objects are left."""
        while len(self._res) > self.capacity - room:
            cands = [(self._rank(k, e), k) for k, e in self._res.items() if k not in protected]
            if not cands:
                return False
            victim = min(cands, key=lambda t: t[0])[1]
            del self._res[victim]
            d.evict.append(victim)
        return True


class LRU(Policy):
    """Least recently used; admits on miss, never prefetches."""

    name = "lru"

    def _rank(self, key: ObjectKey, e: _Entry) -> tuple[float, ...]:
        return (e.last,)


class FIFO(Policy):
    """First in, first out; admits on miss, never prefetches."""

    name = "fifo"

    def _rank(self, key: ObjectKey, e: _Entry) -> tuple[float, ...]:
        return (e.inserted,)


class LFU(Policy):
    """Least frequently used (ties: least recent); admits on miss, never prefetches."""

    name = "lfu"

    def _rank(self, key: ObjectKey, e: _Entry) -> tuple[float, ...]:
        return (e.count, e.last)


def infer_policy(keys: Sequence[ObjectKey]) -> str:
    """The tailored policy whose access pattern ``keys`` follow (when no workload says)."""
    if keys and all(k.kind == "meta" for k in keys):
        return "P4"
    ups = [k for k in keys if k.kind == "update"]
    if len({k.client for k in ups}) > 1:
        return "P2"
    if len({k.round for k in ups}) > 1:
        return "P3"
    return "P1"


class Tailored(Policy):
    """FLStore: P1-P4 chosen per request from the workload (``hint``) or the keys.

    Parameters
    ----------
    meta_rounds
        ``R``: how many of the latest rounds' metadata P4 keeps (default 10).
    """

    name = "flstore"

    def __init__(
        self, capacity: int, catalog: Catalog, *, seed: int = 0, meta_rounds: int = 10
    ) -> None:
        super().__init__(capacity, catalog, seed=seed)
        self.meta_rounds = meta_rounds
        self._latest: dict[str, int] = {}

    def _choose(self, keys: list[ObjectKey], hint: str | None) -> str:
        return hint if hint in TAILORED else infer_policy(keys)

    def _plan(
        self, keys: list[ObjectKey], hint: str | None
    ) -> tuple[list[ObjectKey], list[ObjectKey]]:
        if not keys:
            return [], []
        p = self._choose(keys, hint)
        if p == "P2":
            want, drop = self._p2(keys)
        elif p == "P3":
            want, drop = self._p3(keys)
        else:
            return [], []  # P1 and P4 keep what was asked; P4's window is filled on ingestion
        return [k for k in want if self._exists(k)], drop

    def _exists(self, k: ObjectKey) -> bool:
        """Whether ``k`` is written (prefetch never asks for what the cold store lacks)."""
        rounds = self.catalog.rounds(k.job)
        i = bisect.bisect_left(rounds, k.round)
        if i == len(rounds) or rounds[i] != k.round:
            return False
        return k.kind != "update" or k.client in self.catalog.clients(k.job, k.round)

    def _p2(self, keys: list[ObjectKey]) -> tuple[list[ObjectKey], list[ObjectKey]]:
        job = keys[0].job
        ups = [k for k in keys if k.kind == "update" and k.job == job]
        anchor = max((k.round for k in ups), default=max(k.round for k in keys))
        rounds = self.catalog.rounds(job)
        _, nxt = neighbour_rounds(rounds, anchor)
        want: list[ObjectKey] = []
        for r in [anchor] + ([nxt] if nxt is not None else []):
            want += [update(job, c, r) for c in self.catalog.clients(job, r)]
            want += [
                ObjectKey(job, r + (k.round - anchor), k.kind)
                for k in keys
                if k.kind != "update" and k.job == job and r + (k.round - anchor) >= 0
            ]
        low = min(k.round for k in keys if k.job == job)
        latest = self._latest.get(job, rounds[-1] if rounds else anchor)
        # the base global of the round before stays: windows over the last rounds (FoolsGold,
        # provenance) turn that round's weights into updates with it (one model, not a round)
        drop = [
            k
            for k in self._res
            if k.job == job
            and k.round < low
            and k.round != latest
            and k.kind != "meta"
            and not (k.kind == "global" and k.round == low - 1)
        ]
        return want, drop

    def _p3(self, keys: list[ObjectKey]) -> tuple[list[ObjectKey], list[ObjectKey]]:
        job = keys[0].job
        ups = [k for k in keys if k.kind == "update" and k.job == job]
        clients = sorted({k.client for k in ups}) or []
        want: list[ObjectKey] = []
        drop: list[ObjectKey] = []
        others = [k for k in keys if k.kind != "update" and k.job == job]
        for c in clients:
            mine = sorted(k.round for k in ups if k.client == c)
            hist = self.catalog.client_rounds(job, c)
            prev, _ = neighbour_rounds(hist, mine[0])
            _, nxt = neighbour_rounds(hist, mine[-1])
            for r in (prev, nxt):
                if r is None:
                    continue
                want.append(update(job, c, r))
                want += [
                    ObjectKey(job, r + (o.round - mine[-1]), o.kind)
                    for o in others
                    if r + (o.round - mine[-1]) >= 0
                ]
            floor = prev if prev is not None else mine[0]
            drop += [
                k
                for k in self._res
                if k.job == job and k.kind == "update" and k.client == c and k.round < floor
            ]
        return want, drop

    def _on_round(self, job: str, rnd: int) -> tuple[list[ObjectKey], list[ObjectKey]]:
        prev_latest = self._latest.get(job)
        if prev_latest is not None and rnd < prev_latest:
            return [], []
        self._latest[job] = rnd
        # hot data of the new round: metadata (P4), global model (P1), all updates (P2)
        want = [meta(job, rnd), global_model(job, rnd)]
        want += [update(job, c, rnd) for c in self.catalog.clients(job, rnd)]
        cutoff = rnd - self.meta_rounds
        drop = [
            k
            for k in self._res
            if k.job == job and k.kind == "meta" and k.round <= cutoff and self._res[k].count == 0
        ]
        return want, drop

    def _rank(self, key: ObjectKey, e: _Entry) -> tuple[float, ...]:
        # protect the latest round's hot data and the P4 metadata window, then LRU
        latest = self._latest.get(key.job)
        pinned = latest is not None and (
            key.round == latest or (key.kind == "meta" and key.round > latest - self.meta_rounds)
        )
        return (1 if pinned else 0, e.last)


class Static(Tailored):
    """FLStore-Static: P1 for every request, whatever the workload (paper, appendix C)."""

    name = "static"

    def _choose(self, keys: list[ObjectKey], hint: str | None) -> str:
        return "P1"

    def _on_round(self, job: str, rnd: int) -> tuple[list[ObjectKey], list[ObjectKey]]:
        if rnd < self._latest.get(job, -1):
            return [], []
        self._latest[job] = rnd
        return [global_model(job, rnd)], []


class RandomTailored(Tailored):
    """FLStore-Random: a tailored policy picked at random for each request (paper, 5.4)."""

    name = "random"

    def _choose(self, keys: list[ObjectKey], hint: str | None) -> str:
        return self._rng.choice(TAILORED)


POLICIES: dict[str, type[Policy]] = {
    "flstore": Tailored,
    "lru": LRU,
    "fifo": FIFO,
    "lfu": LFU,
    "random": RandomTailored,
    "static": Static,
}


def make_policy(name: str, capacity: int, catalog: Catalog, **kw: int) -> Policy:
    """Build the policy called ``name`` (one of :data:`POLICIES`)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
    return cls(capacity, catalog, **kw)

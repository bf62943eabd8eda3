"""Request traces and a pure trace simulator for comparing cache policies.

Traces follow the paper's evaluation (section 5.4): FL jobs with 10 of 250 clients per round; the
P2 trace asks for each client of each round in turn (20,000 requests over 2,000 rounds), the P3
trace follows one client across the rounds it took part in, the P4 trace asks, after every round,
for the metadata of the last 10 rounds. These touch every object once, so policies that only
admit on a miss (LRU, FIFO, LFU) cannot hit; :func:`repeated_trace` gives them a fair chance with
Zipf-popular repeats, and :func:`mixed_trace` interleaves all workloads under a small capacity.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cache_engine.catalog import MemoryCatalog
from cache_engine.keys import ObjectKey, global_model, meta, update
from cache_engine.policies import Policy


@dataclass(frozen=True)
class Request:
    """A query for ``keys``; ``hint`` is the tailored policy its workload maps to."""

    keys: tuple[ObjectKey, ...]
    hint: str | None = None


@dataclass(frozen=True)
class RoundComplete:
    """Round ``round`` of ``job`` was written (ingestion)."""

    job: str
    round: int


Event = Request | RoundComplete


@dataclass
class Trace:
    """A named event sequence over a catalog (the catalog is the complete history)."""

    name: str
    catalog: MemoryCatalog
    events: list[Event]
    note: str = ""


@dataclass
class SimResult:
    """Hit counts of one policy on one trace (request-level and object-level)."""

    policy: str
    trace: str
    requests: int = 0
    hits: int = 0
    misses: int = 0
    key_hits: int = 0
    key_misses: int = 0
    prefetched: int = 0
    evicted: int = 0
    peak_objects: int = 0
    by_hint: dict[str, list[int]] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def key_hit_rate(self) -> float:
        n = self.key_hits + self.key_misses
        return self.key_hits / n if n else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "trace": self.trace,
            "requests": self.requests,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "key_hits": self.key_hits,
            "key_misses": self.key_misses,
            "key_hit_rate": self.key_hit_rate,
            "prefetched": self.prefetched,
            "evicted": self.evicted,
            "peak_objects": self.peak_objects,
        }


def simulate(policy: Policy, trace: Trace | Iterable[Event], name: str = "") -> SimResult:
    """Run ``policy`` over the events of ``trace`` and count hits."""
    events = trace.events if isinstance(trace, Trace) else list(trace)
    res = SimResult(policy.name, trace.name if isinstance(trace, Trace) else name)
    for ev in events:
        if isinstance(ev, RoundComplete):
            d = policy.on_round_complete(ev.job, ev.round)
        else:
            d = policy.on_request(ev.keys, ev.hint)
            res.requests += 1
            res.hits += d.hit
            res.misses += not d.hit
            res.key_hits += len(d.hits)
            res.key_misses += len(d.misses)
            hb = res.by_hint.setdefault(ev.hint or "-", [0, 0])
            hb[0] += d.hit
            hb[1] += 1
        res.prefetched += len(d.prefetch)
        res.evicted += len(d.evict)
        res.peak_objects = max(res.peak_objects, len(policy))
    return res


def fl_history(
    job: str = "job",
    rounds: int = 2000,
    per_round: int = 10,
    pool: int = 250,
    seed: int = 0,
    first: int = 1,
) -> MemoryCatalog:
    """A job's history: ``per_round`` of ``pool`` clients drawn uniformly each round."""
    rng = random.Random(seed)
    cat = MemoryCatalog()
    names = [f"c{i:03d}" for i in range(pool)]
    for r in range(first, first + rounds):
        cat.add_round(job, r, rng.sample(names, per_round))
    return cat


def p2_trace(
    rounds: int = 2000, per_round: int = 10, pool: int = 250, seed: int = 0, job: str = "job"
) -> Trace:
    """Per-round workloads (filtering, clustering, contribution): each client of each round."""
    cat = fl_history(job, rounds, per_round, pool, seed)
    ev: list[Event] = [
        Request((update(job, c, r),), "P2") for r in cat.rounds(job) for c in cat.clients(job, r)
    ]
    return Trace("p2", cat, ev, f"{rounds} rounds x {per_round} of {pool} clients, written before")


def p3_trace(
    rounds: int = 5000,
    per_round: int = 10,
    pool: int = 250,
    seed: int = 0,
    job: str = "job",
    max_requests: int | None = None,
) -> Trace:
    """One client tracked across every round it took part in (debugging, provenance)."""
    cat = fl_history(job, rounds, per_round, pool, seed)
    client = max(
        sorted({c for r in cat.rounds(job) for c in cat.clients(job, r)}),
        key=lambda c: len(cat.client_rounds(job, c)),
    )
    hist = list(cat.client_rounds(job, client))[:max_requests]
    ev: list[Event] = [Request((update(job, client, r),), "P3") for r in hist]
    return Trace(
        f"p3-{len(ev)}",
        cat,
        ev,
        f"client {client} over its {len(ev)} rounds of {rounds} ({per_round} of {pool})",
    )


def p4_trace(
    rounds: int = 2000,
    per_round: int = 10,
    pool: int = 250,
    seed: int = 0,
    job: str = "job",
    window: int = 10,
    per_round_requests: int = 10,
) -> Trace:
    """Live job: after each round, analysts ask for the metadata of the last ``window`` rounds."""
    cat = fl_history(job, rounds, per_round, pool, seed)
    ev: list[Event] = []
    for r in cat.rounds(job):
        ev.append(RoundComplete(job, r))
        lo = max(1, r - window + 1)
        keys = tuple(meta(job, x) for x in range(lo, r + 1))
        ev += [Request((keys[-1],), "P4")] * (per_round_requests - 1)
        ev.append(Request(keys, "P4"))
    # the P4 requests of one round: scheduling/incentives read the new round's metadata, and a
    # hyperparameter check reads the whole window
    name = "p4" if per_round_requests == 1 else f"p4-x{per_round_requests}"
    return Trace(name, cat, ev, f"{rounds} rounds, {per_round_requests} requests per round")


def repeated_trace(
    requests: int = 20000,
    rounds: int = 200,
    per_round: int = 10,
    pool: int = 250,
    seed: int = 0,
    job: str = "job",
    zipf: float = 1.1,
) -> Trace:
    """Single-object queries (evaluate a client or a global model) with Zipf-popular repeats."""
    cat = fl_history(job, rounds, per_round, pool, seed)
    rng = random.Random(seed + 1)
    objs: list[ObjectKey] = []
    for r in cat.rounds(job):
        objs.append(global_model(job, r))
        objs += [update(job, c, r) for c in cat.clients(job, r)]
    rng.shuffle(objs)
    weights = [1.0 / (i + 1) ** zipf for i in range(len(objs))]
    ev: list[Event] = [Request((k,), "P1") for k in rng.choices(objs, weights, k=requests)]
    return Trace(
        "repeated",
        cat,
        ev,
        f"{requests} single-object requests, Zipf s={zipf} over {len(objs)} objects",
    )


def mixed_trace(
    rounds: int = 500, per_round: int = 10, pool: int = 250, seed: int = 0, job: str = "job"
) -> Trace:
    """A live job where P1-P4 workloads interleave as rounds complete."""
    cat = fl_history(job, rounds, per_round, pool, seed)
    rng = random.Random(seed + 2)
    ev: list[Event] = []
    tracked = rng.sample(sorted({c for r in cat.rounds(job) for c in cat.clients(job, r)}), 3)
    for r in cat.rounds(job):
        ev.append(RoundComplete(job, r))
        ups = tuple(update(job, c, r) for c in cat.clients(job, r))
        ev.append(Request(ups + (global_model(job, r - 1),) if r > 1 else ups, "P2"))
        ev.append(Request((global_model(job, r),), "P1"))
        ev.append(Request(tuple(meta(job, x) for x in range(max(1, r - 9), r + 1)), "P4"))
        for c in tracked:
            if r in cat.client_rounds(job, c):
                ev.append(Request((update(job, c, r),), "P3"))
        if rng.random() < 0.3:  # an analyst re-checks a recent round
            back = rng.randint(max(1, r - 5), r)
            ev.append(Request(tuple(update(job, c, back) for c in cat.clients(job, back)), "P2"))
    return Trace("mixed", cat, ev, f"{rounds} live rounds, P1-P4 interleaved")


def paper_traces() -> list[Trace]:
    """The traces of the benchmark table, in order."""
    return [
        p2_trace(),
        p3_trace(rounds=2000, max_requests=64),
        p3_trace(),
        p4_trace(rounds=20000, per_round_requests=1),
        p4_trace(),
        repeated_trace(),
        mixed_trace(),
    ]


def hit_table(
    policies: Sequence[str], traces: Sequence[Trace], capacity: int = 64
) -> list[SimResult]:
    """Simulate every policy on every trace (fresh policy per trace)."""
    from cache_engine.policies import make_policy

    out = []
    for t in traces:
        for p in policies:
            out.append(simulate(make_policy(p, capacity, t.catalog), t))
    return out

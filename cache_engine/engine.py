"""The cache engine: applies the policy, places objects on cache functions, keeps replicas.

State in Redis (shared with the request tracker and a restarted engine): the location table
(:mod:`cache_engine.table`), the catalog of written rounds (``flstore:catalog:<job>``: round ->
clients) and the cache functions (``flstore:functions``: name -> incarnation).

Placement keeps the objects of one query on the same functions (a primary and ``k``
secondaries), so a workload always runs where all of its data is; a function that fills up gets a
neighbour, created through the provider API. A liveness loop pings every function; one that stops
answering, or comes back with a new incarnation (its memory is gone), is dropped from the table
and every object it held is copied again until each has ``1 + k`` holders. Nothing is lost: the
cold store holds everything.

Metadata-only queries (every object they read is a round's ``meta.json``, no evaluator: e.g.
``track``, ``oort``) are answered here when the engine holds those rounds' metadata, which it
reads anyway when it ingests a round (the newest :data:`META_ROUNDS` rounds are kept): the same
workload code on the same dicts as a cache function, without the hop to one. The others, and
metadata the engine no longer holds, go to the cache functions.

Every change a query's plan depends on (the table, the catalog, the evaluators, the functions'
addresses) is published on ``flstore:changes`` (:data:`cache_engine.table.CHANGES`): the request
tracker keeps plans until then and reports the queries it answered on them (:meth:`touch`).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from cache_engine.budget import MemoryBudget, OverBudget, default_budget
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import ColdStore, ObjectMissing, object_path
from cache_engine.errors import EngineError
from cache_engine.evaluators import evaluator_replicas, function_spec_problem
from cache_engine.keys import ObjectKey
from cache_engine.parts import PartPlanner, parts_needed
from cache_engine.policies import Decision, make_policy
from cache_engine.queries import Plan, parse_query, plan, run_workload
from cache_engine.settings import EngineSettings
from cache_engine.table import CHANGES, RedisLocationTable
from fedfaas.auth import AuthConfigError, bearer, read_token_file
from fedfaas.objstore.handoff import HandoffError, end_offer
from fedfaas.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS, OpenFaaSError, function_deployment

log = logging.getLogger(__name__)

CATALOG = "flstore:catalog:"
JOBS = "flstore:jobs"
FUNCTIONS = "flstore:functions"
EVALUATORS = "flstore:evaluators"
#: rounds whose metadata the engine keeps for metadata queries (a few KiB each)
META_ROUNDS = 4096
#: the engine's counters (``stats`` in ``/v1/state``, ``flstore_engine_<name>`` in ``/metrics``);
#: every one is there from the start, at 0, so a reader never has to tell "none yet" from
#: "not reported"
STATS = (
    "rounds_ingested",
    "requests",
    "hits",
    "misses",
    "key_hits",
    "key_misses",
    "objects_loaded",
    "load_seconds_x1000",
    "evicted_for_room",
    "evicted_while_loading",
    "objects_evicted",
    "functions_created",
    "functions_lost",
    "failures_reported",
    "table_corrections",
    "restored",
    "prefetched",
    "replicated",
    "answered_here",
    "objects_handed_off",
    "touched",
    "loads_failed",
    "over_budget",
    "evicted_for_budget",
    "queries_in_parts",
    "queries_streamed",
    "parts_placed",
    "offers_ended",
    "evaluators_scaled",
)
#: rounds whose handoff (where a gateway lends their updates) the engine remembers
HANDOFF_ROUNDS = 256
#: how long an offer the engine cannot end is counted against the budget (the gateway's
#: default ``handoff_ttl_s``)
OFFER_TTL_GUESS_S = 30.0
_TICKET = re.compile(r"^[0-9a-f]{32}$")
#: a cache function's own address it may report (loopback or a host, a port, no path)
_DIRECT = re.compile(r"^http://[A-Za-z0-9.-]{1,253}:[0-9]{1,5}$")


def handoff_problem(h: Any) -> str | None:
    """What is wrong with a round's ``handoff`` (None: nothing): ``{"socket": absolute path
    of the gateway's handoff socket, "ticket": 32 hex characters, "node": the gateway's
    node}`` (:mod:`fedfaas.objstore.handoff`)."""
    if not isinstance(h, dict):
        return "'handoff' must be an object {socket, ticket, node}"
    sock, ticket, node = h.get("socket"), h.get("ticket"), h.get("node")
    if not isinstance(sock, str) or not sock.startswith("/") or len(sock) > 4096:
        return "'handoff.socket' must be an absolute path"
    if not isinstance(ticket, str) or not _TICKET.match(ticket):
        return "'handoff.ticket' must be 32 lower-case hex characters"
    if not isinstance(node, str) or not node:
        return "'handoff.node' must name the gateway's node"
    if set(h) - {"socket", "ticket", "node"}:
        return f"'handoff' has unknown fields {sorted(set(h) - {'socket', 'ticket', 'node'})}"
    return None


class NoCapacity(EngineError):
    status, code = 507, "no_capacity"


class LoadFailed(EngineError):
    status, code = 502, "load_failed"


class RoundMissing(EngineError):
    status, code = 404, "round_not_written"


class NoEvaluator(EngineError):
    status, code = 422, "no_evaluator"


@dataclass
class FunctionInfo:
    """A cache function as the engine sees it."""

    name: str
    incarnation: str = ""
    used: int = 0
    alive: bool = True
    failures: int = 0
    created: float = field(default_factory=time.time)
    #: the replica's own address, from its /ping (None: reached through the gateway only)
    url: str | None = None
    #: bytes of loads under way to it (set aside by :meth:`CacheEngine.ensure`)
    reserved: int = 0

    @property
    def taken(self) -> int:
        """Bytes it holds, as it last said, and those on their way to it."""
        return self.used + self.reserved


class CacheEngine:
    """FLStore's cache engine (see module docstring)."""

    def __init__(
        self, settings: EngineSettings, redis: Any, cold: ColdStore, openfaas: OpenFaaS
    ) -> None:
        self.s = settings
        self.redis = redis
        self.cold = cold
        self.openfaas = openfaas
        if settings.function_token_file is None:
            raise AuthConfigError(
                "no function token file: pass --function-token-file PATH (the value of the "
                f"runtime secret {FUNCTION_TOKEN_SECRET}, which the cache functions require)"
            )
        #: the cache functions' credential (they are deployed with the secret it comes from)
        self._function_auth = bearer(
            read_token_file(settings.function_token_file, "function token")
        )
        self.table = RedisLocationTable(redis)
        self.catalog = MemoryCatalog()
        self.policy = make_policy(settings.policy, settings.capacity_objects, self.catalog)
        self.functions: dict[str, FunctionInfo] = {}
        self.sizes: dict[tuple[str, str], int] = {}
        self.evaluators: dict[str, dict[str, Any]] = {}
        #: the newest ingested rounds' metadata (the ``meta`` objects), for metadata queries
        self.metas: OrderedDict[ObjectKey, dict[str, Any]] = OrderedDict()
        #: (job, round) -> where its root gateway lends its updates (newest HANDOFF_ROUNDS)
        self.handoffs: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self.stats: Counter[str] = Counter(dict.fromkeys(STATS, 0))
        self._lock = threading.RLock()
        self._inflight: dict[ObjectKey, threading.Event] = {}
        self._pending_evictions = 0
        self._bg: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engine-load")
        self._threads: list[threading.Thread] = []
        #: the node's memory budget for FLStore (``cache_engine.budget``)
        self.budget = MemoryBudget(
            settings.memory_budget_bytes or default_budget(settings.memory_budget_fraction)
        )
        #: whole update -> the functions that map it (or parts of it) in place
        self.mapped: dict[ObjectKey, set[str]] = {}
        self.parts = PartPlanner(self)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Read state from Redis, adopt live functions, start the pinger and the worker."""
        self.table.load()
        for job in self.redis.smembers(JOBS):
            for rnd, clients in self.redis.hgetall(CATALOG + job).items():
                self.catalog.add_round(job, int(rnd), json.loads(clients))
        for job, spec in self.redis.hgetall(EVALUATORS).items():
            self.evaluators[job] = json.loads(spec)
        for name, inc in self.redis.hgetall(FUNCTIONS).items():
            self.functions[name] = FunctionInfo(name, inc)
        for name in list(self.functions):
            self._check(name)
        for key in self.table.objects():  # the policy learns what is resident
            self.policy.on_request([key.whole])
        for target in (self._ping_loop, self._worker):
            t = threading.Thread(target=target, daemon=True, name=target.__name__)
            t.start()
            self._threads.append(t)
        log.info(
            "cache engine started: %d objects, %d functions, policy %s",
            len(self.table),
            len(self.functions),
            self.policy.name,
        )

    def stop(self) -> None:
        self._stop.set()
        self._bg.put(("stop", None))
        for t in self._threads:
            t.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.parts.close()

    # -- ingestion ------------------------------------------------------------------------
    def ingest(self, job: str, rnd: int, handoff: dict[str, Any] | None = None) -> dict[str, Any]:
        """Round ``rnd`` of ``job`` is in the cold store: record it and cache its hot data.

        ``handoff`` (see :func:`handoff_problem`): the round's updates are also lent by the
        root gateway's store; loads of them pass it on, and a cache function on that node maps
        them in place instead of reading MinIO (one on another node reads MinIO)."""
        try:
            m = self.cold.round_meta(job, rnd)
        except ObjectMissing:
            raise RoundMissing(
                f"round {rnd} of job {job!r} has no meta.json in the cold store "
                f"({object_path(ObjectKey(job, rnd, 'meta'))})",
                job=job,
                round=rnd,
            ) from None
        # the update objects actually stored are the truth (a writer may list clients in
        # meta.json without storing their updates)
        clients = self.cold.client_ids(job, rnd)
        if handoff:
            with self._lock:
                self.handoffs[(job, rnd)] = handoff
                while len(self.handoffs) > HANDOFF_ROUNDS:
                    self.handoffs.popitem(last=False)
            # the offer keeps the round's updates in the store until it ends
            self.budget.lease(
                (f"offer:{handoff['ticket']}:{c}", self._size(ObjectKey(job, rnd, "update", c)))
                for c in clients
            )
        spec = (m.get("round_meta") or {}).get("evaluator")
        if isinstance(spec, dict):
            if self.evaluators.get(job) != spec and spec.get("kind") == "function":
                self._bg.put(("scale", spec))
            self.evaluators[job] = spec
            self.redis.hset(EVALUATORS, job, json.dumps(spec))
        with self._lock:
            self.catalog.add_round(job, rnd, clients)
            key = ObjectKey(job, rnd, "meta")
            self.metas[key] = m
            self.metas.move_to_end(key)
            while len(self.metas) > META_ROUNDS:
                self.metas.popitem(last=False)
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(JOBS, job)
            pipe.hset(CATALOG + job, str(rnd), json.dumps(clients))
            pipe.publish(CHANGES, job)  # the catalog and the evaluator above
            pipe.execute()
            d = self.policy.on_round_complete(job, rnd)
        self._carry_out(d)
        if handoff:  # after the round's prefetch has claimed what it keeps (one worker, FIFO)
            self._bg.put(("end_offer", (handoff, clients)))
        self.stats["rounds_ingested"] += 1
        return {
            "job": job,
            "round": rnd,
            "clients": clients,
            "hot": [k.id for k in d.prefetch],
            "evicted": [k.id for k in d.evict],
        }

    # -- queries ----------------------------------------------------------------------------
    def plan(self, body: dict[str, Any]) -> Plan:
        """Validate a query and list the objects it needs (raises 4xx errors)."""
        return plan(parse_query(body), self.catalog)

    def acquire(self, body: dict[str, Any]) -> dict[str, Any]:
        """Make sure a query's objects are cached; return the functions that hold all of them,
        or, for a metadata query whose metadata the engine holds, its ``result`` (see the
        module)."""
        out = self._acquire(body, wait=True)
        assert out is not None
        return out

    def acquire_held(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """:meth:`acquire` where it needs no load and no wait (a function holds every object
        already, or the engine answers): what the service answers on its event loop. None,
        with nothing done, for the rest."""
        return self._acquire(body, wait=False)

    def _acquire(self, body: dict[str, Any], *, wait: bool) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        p = self.plan(body)
        result = self._answer_here(p)
        if result is not None:
            return {
                **_planned(p),
                "holders": [],
                "result": result,
                "hit": True,
                "engine_s": time.perf_counter() - t0,
            }
        spec = self.evaluators.get(p.query.job) if p.evaluator else None
        if p.evaluator and spec is None:
            raise NoEvaluator(
                f"workload {p.query.workload!r} needs a validation-set evaluator, "
                f"and job {p.query.job!r} declares none (round 0's "
                "round_meta.evaluator)",
                job=p.query.job,
            )
        with self._lock:
            if not wait and not self._live_holders(p.keys):
                return None
            d = self.policy.on_request(p.keys, p.policy)
        self._count(d)
        loaded0 = self.stats["objects_loaded"]
        if self.parts.too_big(p.keys):  # in coordinate parts across functions
            routed = self.parts.acquire(p)
            self._carry_out(Decision(prefetch=d.prefetch, evict=d.evict))
        else:
            try:  # one complete copy on the query path; the secondaries follow in the background
                holders = self.ensure(p.keys, copies=1)
            except (OverBudget, NoCapacity) as exc:  # the cold store can still serve it
                models = [k for k in p.keys if k.kind != "meta"]
                metas = [k for k in p.keys if k.kind == "meta"]
                if not models:
                    raise
                dim = self.parts.dim(p.query.job, models[0])
                routed = self.parts.stream(p, models, metas, dim, str(exc))
            else:
                self._follow_up(p.keys, holders, d)
                with self._lock:
                    direct = {
                        f: u for f in holders if (u := getattr(self.functions.get(f), "url", None))
                    }
                routed = {"holders": holders, "endpoints": direct}
        loaded = self.stats["objects_loaded"] - loaded0  # approximate under concurrency
        return {
            **_planned(p),
            **routed,
            "evaluator": spec,
            "hit": d.hit,
            "misses": [k.id for k in d.misses],
            "loaded": loaded,
            "prefetch": [k.id for k in d.prefetch],
            "evict": [k.id for k in d.evict],
            "engine_s": time.perf_counter() - t0,
        }

    def touch(self, bodies: Sequence[dict[str, Any]]) -> int:
        """Queries the request tracker answered on plans it kept, without ``/v1/acquire``: the
        policy sees each as the request it was, and what it decides (prefetch, eviction, a
        missing secondary) starts, as :meth:`acquire` would have started it. A query whose
        objects are no longer all held is skipped (the policy would count as resident what
        nothing loads). Returns how many were counted."""
        counted = 0
        for body in bodies:
            try:
                p = self.plan(body)
            except EngineError:
                continue
            with self._lock:
                holders = self._live_holders(p.keys)
                if not holders:
                    continue
                d = self.policy.on_request(p.keys, p.policy)
            self._count(d)
            self._follow_up(p.keys, holders, d)
            counted += 1
        self.stats["touched"] += counted
        return counted

    def _count(self, d: Decision) -> None:
        self.stats["requests"] += 1
        self.stats["hits" if d.hit else "misses"] += 1
        self.stats["key_hits"] += len(d.hits)
        self.stats["key_misses"] += len(d.misses)

    def _follow_up(self, keys: Sequence[ObjectKey], holders: list[str], d: Decision) -> None:
        """What a request leaves to the background: the secondaries its objects lack, and the
        policy's prefetch and evictions."""
        if len(holders) < 1 + self.s.secondaries:
            self._bg.put(("replicate", list(keys)))
        self._carry_out(Decision(prefetch=d.prefetch, evict=d.evict))

    def _kept(self, key: ObjectKey) -> bool:
        """Whether the policy keeps ``key`` (a part: the whole object it is part of)."""
        return key.whole in self.policy

    def _unmapped(self, fn: str, keys: Iterable[ObjectKey]) -> None:
        """``fn`` gave up ``keys``: an update it maps no part of any more is no longer kept in
        the store by it (under the lock)."""
        on_fn = {k.whole for k in self.table.keys_on(fn)}
        for whole in {k.whole for k in keys} - on_fn:
            fns = self.mapped.get(whole)
            if fns is not None:
                fns.discard(fn)
                if not fns:
                    del self.mapped[whole]
                    self.budget.unlease([f"mapped:{whole.id}"])

    def _live_holders(self, keys: Sequence[ObjectKey]) -> list[str]:
        """The live functions holding every key, none of which is being loaded (under the
        lock); where there is one, :meth:`ensure` neither loads nor waits."""
        if not keys or any(k in self._inflight for k in keys):
            return []
        common = set(self.table.get(keys[0]))
        for k in keys[1:]:
            common &= set(self.table.get(k))
        return sorted(f for f in common if (i := self.functions.get(f)) is not None and i.alive)

    def _answer_here(self, p: Plan) -> dict[str, Any] | None:
        """The result of a metadata-only query from the metadata held here (None: not one, or
        not all of its rounds are held). Raises the workload's own errors (4xx)."""
        if p.evaluator or not p.keys or any(k.kind != "meta" for k in p.keys):
            return None
        with self._lock:
            held = {k: self.metas.get(k) for k in p.keys}
        if any(v is None for v in held.values()):
            return None
        result = run_workload(p.query.workload, p.params, held, None)
        with self._lock:
            self.stats["answered_here"] += 1
        return result

    def locations(self, ids: Iterable[str]) -> dict[str, list[str]]:
        keys = [ObjectKey.parse(i) for i in ids]
        with self._lock:
            return {k.id: self.table.get(k) for k in keys}

    # -- placement ----------------------------------------------------------------------------
    def ensure(
        self, keys: Sequence[ObjectKey], copies: int | None = None, _room_tries: int = 3
    ) -> list[str]:
        """Place ``keys`` together on ``copies`` (default ``1 + k``) live functions.

        When every function is full and no more may be created, the policy picks victims
        (never ``keys``) until the objects fit.
        """
        n = copies if copies is not None else 1 + self.s.secondaries
        while True:  # wait for loads of these keys already under way (e.g. a prefetch)
            with self._lock:
                waits = [self._inflight[k] for k in keys if k in self._inflight]
            if not waits:
                break
            for ev in waits:
                ev.wait(self.s.call_timeout)
        with self._lock:
            alive = [f for f, i in self.functions.items() if i.alive]
            held = {f: {k for k in keys if f in self.table.get(k)} for f in alive}
            full = [f for f in alive if len(held[f]) == len(keys)]
            primary = self.table.get(keys[0]) if keys else []
            full.sort(key=lambda f: primary.index(f) if f in primary else len(primary))
            chosen: list[str] = []
            #: bytes set aside on each chosen function until its load answers
            booked: dict[str, int] = {}
            if len(full) < n:
                cands = sorted(
                    (f for f in alive if f not in full),
                    key=lambda f: (-len(held[f]), self.functions[f].taken),
                )
                for f in cands:
                    extra = sum(self._size(k) for k in keys if k not in held[f])
                    if self.functions[f].taken + extra <= self.s.function_capacity_bytes:
                        chosen.append(f)
                        booked[f] = extra
                        self.functions[f].reserved += extra
                        if len(full) + len(chosen) == n:
                            break
            missing_fns = n - len(full) - len(chosen)
            todo = {f: [k for k in keys if k not in held.get(f, set())] for f in chosen}
            reserved = sum(self._predicted(ks) for ks in todo.values())
            reserved += max(0, missing_fns) * self._predicted(keys)
            try:  # the node's budget: checked before any load starts
                self.budget.reserve(reserved)
            except OverBudget:
                self._unbook(booked)
                raise
            for ks in todo.values():
                for k in ks:
                    self._inflight.setdefault(k, threading.Event())
        try:
            for _ in range(max(0, missing_fns)):
                try:
                    f = self._new_function()
                except NoCapacity:
                    if _room_tries <= 0 or not self._make_room(keys):
                        raise
                    self.budget.unreserve(reserved)
                    reserved = 0
                    for ks in todo.values():  # give back reservations, then place again
                        for k in ks:
                            done = self._inflight.pop(k, None)
                            if done is not None:
                                done.set()
                    with self._lock:
                        self._unbook(booked)
                    booked = {}
                    todo = {}
                    return self.ensure(keys, copies, _room_tries=_room_tries - 1)
                with self._lock:
                    booked[f] = sum(self._size(k) for k in keys)
                    self.functions[f].reserved += booked[f]
                chosen.append(f)
                todo[f] = list(keys)
            futs = {f: self._pool.submit(self._load, f, ks) for f, ks in todo.items() if ks}
            errors: list[tuple[str, BaseException]] = []
            for f, fut in futs.items():
                try:
                    fut.result()
                except Exception as exc:  # the function died or the cold store failed
                    errors.append((f, exc))
                    chosen.remove(f)
        finally:
            self.budget.unreserve(reserved)  # the functions' own reports count them now
            with self._lock:
                self._unbook(booked)
                for ks in todo.values():
                    for k in ks:
                        done = self._inflight.pop(k, None)
                        if done is not None:
                            done.set()
        if errors and not full and not chosen:
            f0, err0 = errors[0]
            if isinstance(err0, EngineError):
                raise err0
            raise LoadFailed(
                f"could not load the query's objects on any function: {err0}", function=f0
            )
        for f1, err1 in errors:
            self.stats["loads_failed"] += 1
            log.warning("load on %s failed: %s", f1, _one_line(err1))
            self.report_failure(f1)
        return full + chosen

    def _unbook(self, booked: dict[str, int]) -> None:
        """Give back what :meth:`ensure` set aside on functions (under the lock)."""
        for f, nbytes in booked.items():
            info = self.functions.get(f)
            if info is not None:
                info.reserved = max(0, info.reserved - nbytes)

    def _predicted(self, keys: Sequence[ObjectKey]) -> int:
        """Private bytes a function would take to load ``keys``: nothing for an update its
        round's gateway lends (mapped in place: the offer counts it already)."""
        with self._lock:
            return sum(
                self._size(k)
                for k in keys
                if not (k.kind == "update" and (k.job, k.round) in self.handoffs)
            )

    def make_budget_room(self, nbytes: int, keep: Sequence[ObjectKey]) -> None:
        """Evict, in the policy's order, what the budget needs for ``nbytes`` more (never
        ``keep``); :class:`OverBudget` when even that is not enough (nothing is evicted)."""
        room = self.budget.room()
        if nbytes <= room:
            return
        spare = {k.whole for k in keep}
        with self._lock:
            held = {k.whole for k in self.table.objects()} - spare
            order = self.policy.eviction_order(held)
            victims: list[ObjectKey] = []
            freed = 0
            for k in order:
                if room + freed >= nbytes:
                    break
                private = [x for x in [k, *self.table.parts_of(k)] if x in self.table.objects()]
                freed += sum(
                    self._size(x) * len(self.table.get(x))
                    for x in private
                    if not (x.kind == "update" and (x.job, x.round) in self.handoffs)
                )
                victims.append(k)
            if room + freed < nbytes:
                self.stats["over_budget"] += 1
                raise OverBudget(
                    f"{nbytes} bytes do not fit the node's memory budget "
                    f"({self.budget.used()} of {self.budget.limit} bytes used, "
                    f"{freed} more could be evicted)"
                )
            self.policy.forget(victims)
            targets = self._unplace(victims)
        self.stats["evicted_for_budget"] += len(victims)
        self._evict(targets)  # synchronously: the memory is needed now

    def _unplace(self, wholes: Sequence[ObjectKey]) -> dict[str, list[ObjectKey]]:
        """Forget ``wholes`` and every part of them in the table (under the lock); the keys
        to evict, by function."""
        targets: dict[str, list[ObjectKey]] = {}
        for k in wholes:
            for x in [k, *sorted(self.table.parts_of(k))]:
                for f in self.table.remove(x):
                    targets.setdefault(f, []).append(x)
        return targets

    def place(self, keys: Sequence[ObjectKey], *, restore: bool = False) -> None:
        """Place objects the policy keeps (a prefetch, a restoration): together on ``1 + k``
        functions, or, too big for one function, in parts (one copy: ``cache_engine.parts``);
        lost parts go back one group per part."""
        if any(k.parts for k in keys):
            by_part: dict[tuple[int, int], list[ObjectKey]] = {}
            for k in keys:
                by_part.setdefault((k.part, k.parts), []).append(k)
            for group in by_part.values():
                self.ensure(group, copies=1)
            return
        if not self.parts.too_big(keys):
            self.ensure(keys)
            return
        models = [k for k in keys if k.kind != "meta"]
        metas = [k for k in keys if k.kind == "meta"]
        dim = self.parts.dim(models[0].job, models[0])
        n = parts_needed(len(models), self._size(models[0]), self.s.function_capacity_bytes, dim)
        self.parts.place(models, metas, n)

    def _scale_evaluator(self, spec: dict[str, Any]) -> None:
        """Scale a job's evaluator function up to the replicas its spec asks for (never down:
        another job may share it)."""
        problem = function_spec_problem(spec)
        if problem:
            log.warning("evaluator not scaled: %s", problem)
            return
        name = str(spec["function"])
        status = self.openfaas.function(name)
        if status is None:
            log.info("evaluator function %s is not deployed (yet): not scaled", name)
            return
        want = min(evaluator_replicas(spec), status.scale_bounds()[1])
        if status.replicas < want:
            self.openfaas.scale(name, want)
            self.stats["evaluators_scaled"] += 1
            log.info("evaluator function %s scaled to %d replicas", name, want)

    def _end_offer(self, handoff: dict[str, Any], clients: Sequence[str]) -> None:
        """The round's placement has claimed what it keeps: end the gateway's offer now, so
        the updates nobody claimed leave the store (where the engine reaches the node's
        socket; otherwise at the ticket's expiry, about ``handoff_ttl_s``)."""
        ticket = str(handoff["ticket"])
        try:
            end_offer(handoff["socket"], ticket)
            self.stats["offers_ended"] += 1
            delay = 0.0
        except HandoffError as exc:
            log.info("handoff offer of %s not ended here (%s)", handoff.get("node"), exc)
            delay = OFFER_TTL_GUESS_S
        ids = [f"offer:{ticket}:{c}" for c in clients]
        if delay <= 0:
            self.budget.unlease(ids)
        else:
            t = threading.Timer(delay, self.budget.unlease, (ids,))
            t.daemon = True
            t.start()

    def any_function(self) -> str:
        """A live cache function (one is created when there is none)."""
        with self._lock:
            alive = sorted(f for f, i in self.functions.items() if i.alive)
        return alive[0] if alive else self._new_function()

    def _make_room(self, keys: Sequence[ObjectKey]) -> bool:
        """Free one function for ``keys``: evict what it holds, in policy order, sparing
        ``keys``, until they fit; False when nothing can go."""
        want = set(keys)
        with self._lock:
            alive = [f for f, i in self.functions.items() if i.alive]
            if not alive:
                return False
            cap = self.s.function_capacity_bytes

            def missing(f: str) -> int:
                return sum(self._size(k) for k in keys if f not in self.table.get(k))

            f = max(alive, key=lambda f: cap - self.functions[f].taken - missing(f))
            need = self.functions[f].taken + missing(f) - cap
            on_f = self.table.keys_on(f)
            victims: list[ObjectKey] = []
            spare = {k.whole for k in want}
            for k in self.policy.eviction_order({x.whole for x in on_f} - spare):
                if need <= 0:
                    break
                victims.append(k)
                need -= sum(self._size(x) for x in on_f if x.whole == k)
            if not victims or need > 0:
                return False
            self.policy.forget(victims)
            targets = self._unplace(victims)
        self.stats["evicted_for_room"] += len(victims)
        self._evict(targets)  # synchronously: the space is needed now
        return True

    def _invoke(
        self, fn: str, path: str, body: Any = None, timeout: float | None = None
    ) -> httpx.Response:
        """``GET`` (no body) or ``POST`` (JSON body) ``/function/<fn><path>``, with the token."""
        return self.openfaas.invoke(
            fn,
            method="GET" if body is None else "POST",
            path=path,
            json=body,
            headers=self._function_auth,
            timeout=timeout,
        )

    def _load(self, fn: str, keys: list[ObjectKey]) -> None:
        t0 = time.perf_counter()
        # the function has no MinIO user: each load brings read credentials for its jobs only
        grants = self.cold.job_credentials({k.job for k in keys})
        load: dict[str, Any] = {"objects": [k.id for k in keys], "credentials": grants}
        with self._lock:
            lent = {(k.job, k.round) for k in keys if k.kind == "update"}
            offers = [self.handoffs[r] for r in sorted(lent) if r in self.handoffs]
        if offers:
            load["handoff"] = offers
        r = self._invoke(fn, "/load", load, timeout=self.s.call_timeout)
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code == 404 and body.get("error") == "object_missing":
            raise LoadFailed(body.get("detail", "object missing in cold store"))
        if r.status_code != 200:
            raise LoadFailed(f"{fn} /load: HTTP {r.status_code} {r.text[:200]}", function=fn)
        with self._lock:
            info = self.functions.get(fn)
            if info is not None:
                info.used = int(body.get("bytes", info.used))
            self.budget.report(fn, int(body.get("private_bytes", body.get("bytes", 0))))
            for ident in body.get("mapped") or ():
                whole = ObjectKey.parse(ident).whole
                if whole not in self.mapped:
                    self.budget.lease([(f"mapped:{whole.id}", self._size(whole))])
                self.mapped.setdefault(whole, set()).add(fn)
            # a key the policy evicted while it loaded is not indexed (nothing would ever evict
            # it again): it is freed after the grace, so the query that asked for it finishes
            gone = []
            with self.table.batch():
                for k in keys:
                    if self._kept(k):
                        self.table.add(k, fn)
                    else:
                        gone.append(k)
        if gone:
            self.stats["evicted_while_loading"] += len(gone)
            self._evict_later({fn: gone})
        self.stats["objects_loaded"] += len(keys)
        self.stats["objects_handed_off"] += len(body.get("mapped") or ())
        self.stats["load_seconds_x1000"] += int(1000 * (time.perf_counter() - t0))

    def _size(self, key: ObjectKey) -> int:
        """Bytes ``key`` takes in a function (models of a job all have one size; a part of
        ``S`` a ``1/S`` share)."""
        if key.parts:
            return -(-self._size(key.whole) // key.parts)
        # a round's metadata grows with its clients: each is sized on its own
        kind = key.id if key.kind == "meta" else "model"
        s = self.sizes.get((key.job, kind))
        if s is None:
            try:
                s = self.cold.size(key)
            except Exception:
                return 4096 if key.kind == "meta" else 1 << 20  # unknown yet; learned on load
            self.sizes[(key.job, kind)] = s
            while len(self.sizes) > 1 << 16:  # metadata of long-gone rounds
                self.sizes.pop(next(iter(self.sizes)))
        return s

    def _new_function(self) -> str:
        with self._lock:
            if len(self.functions) >= self.s.max_functions:
                raise NoCapacity(
                    f"all {self.s.max_functions} cache functions are full; raise "
                    "FEDFAAS_ENGINE_MAX_FUNCTIONS or function_capacity_bytes",
                    functions=len(self.functions),
                )
            i = 0
            while f"{self.s.function_prefix}{i}" in self.functions:
                i += 1
            name = f"{self.s.function_prefix}{i}"
            self.functions[name] = FunctionInfo(name, alive=False)
        env = {
            "FEDFAAS_FLSTORE_MINIO_ENDPOINT": self.s.minio_endpoint,
            "FEDFAAS_FLSTORE_BUCKET": self.s.bucket,
            "FEDFAAS_FLSTORE_CAPACITY_BYTES": str(self.s.function_capacity_bytes),
            # the gateway the function calls a job's evaluator function through
            "FEDFAAS_FLSTORE_GATEWAY_URL": self.s.runtime_url,
            # of-watchdog's exec_timeout: loads and workloads on 44.7 MB updates take longer
            # than the 30 s default on a busy 2-core machine, and a contribution query over a
            # round of hundreds of them takes minutes (the tracker's long_query_timeout)
            "exec_timeout": f"{int(max(self.s.call_timeout, self.s.run_timeout))}s",
            **self.s.function_env,
        }
        try:
            body = function_deployment(
                name,
                self.s.function_image,
                env=env,
                labels={"com.fedfaas.role": "flstore-cache"},
                handler_dir=self.s.handler_dir,
                secrets=[FUNCTION_TOKEN_SECRET],
            )
            res = self.openfaas.deploy(body)
            if not res.ok:
                raise NoCapacity(f"cache function {name} not deployed: {res.status} {res.message}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if self._ping(name) is not None:
                    break
                time.sleep(0.2)
            else:
                raise NoCapacity(f"cache function {name} did not become ready in 60 s")
        except Exception:
            with self._lock:
                self.functions.pop(name, None)
            raise
        self.stats["functions_created"] += 1
        return name

    # -- liveness and replicas ----------------------------------------------------------------
    def _ping(self, name: str) -> dict[str, Any] | None:
        body, _ = self._probe(name)
        return body

    def _probe(self, name: str) -> tuple[dict[str, Any] | None, bool]:
        """Ping ``name``: (status body, or None and whether the failure is definitive)."""
        try:
            r = self._invoke(name, "/ping", timeout=self.s.ping_timeout)
        except OpenFaaSError as exc:  # a timeout: busy (a long workload holding the CPU), not
            return None, not exc.timed_out  # necessarily dead; else no process there
        if r.status_code == 401:
            log.error(
                "cache function %s refused the engine's function token (401): the function "
                "token file must hold the runtime secret %s",
                name,
                FUNCTION_TOKEN_SECRET,
            )
        if r.status_code != 200:
            return None, r.status_code in (404, 500, 502, 503)
        body: dict[str, Any] = r.json()
        inc = f"{body.get('pid')}:{body.get('started')}"
        with self._lock:
            info = self.functions.setdefault(name, FunctionInfo(name))
            fresh = not info.alive and not info.incarnation
            changed = bool(info.incarnation) and info.incarnation != inc
            back = not info.alive and info.incarnation == inc and info.failures > 0
            info.incarnation, info.alive, info.failures = inc, True, 0
            info.used = int(body.get("bytes", 0))
            self.budget.report(name, int(body.get("private_bytes", info.used)))
            url = body.get("url")
            url = url if isinstance(url, str) and _DIRECT.match(url) else None
            moved, info.url = url != info.url, url
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(FUNCTIONS, name, inc)
            if moved:  # plans name the functions' addresses
                pipe.publish(CHANGES, "")
            pipe.execute()
        if changed:  # same name, new process: its memory is gone
            log.warning("cache function %s restarted (%s); its objects are lost", name, inc)
            self._lost(name)
        elif back:  # declared dead, yet the same process answers: drop what it still holds
            log.warning("cache function %s answers again; clearing its stale objects", name)
            self._bg.put(("flush", name))
        elif fresh:
            log.info("cache function %s is ready", name)
        return body, False

    def _check(self, name: str) -> bool:
        body, definitive = self._probe(name)
        if body is not None:
            return True
        with self._lock:
            info = self.functions.get(name)
            if info is None:
                return False
            info.failures += 1
            dead = definitive or info.failures >= self.s.dead_after
            was_alive = info.alive
            if dead:
                info.alive = False
        if dead and was_alive:
            log.warning(
                "cache function %s does not answer (%s)",
                name,
                "refused" if definitive else f"{info.failures} timeouts",
            )
            self._lost(name)
        return False

    def report_missing(self, name: str, ids: Sequence[str]) -> int:
        """Function ``name`` says it lacks objects the table gives it: believe the function,
        and copy those the policy keeps to ``1 + k`` holders again (a function restarted
        under the same name answers so before the liveness loop sees its new incarnation,
        whose restore then no longer finds them in the table)."""
        gone: list[ObjectKey] = []
        with self._lock, self.table.batch():
            for i in ids:
                k = ObjectKey.parse(i)
                # a function asked for a part of a model names the model
                for x in [k, *(self.table.parts_of(k) if not k.parts else ())]:
                    if name in self.table.get(x):
                        self.table.discard(x, name)
                        gone.append(x)
            self._unmapped(name, gone)
            kept = [k for k in gone if self._kept(k)]
        self.stats["table_corrections"] += len(gone)
        if kept:
            self._bg.put(("restore", kept))
        return len(gone)

    def report_failure(self, name: str) -> bool:
        """Someone (the tracker) could not reach ``name``: check it now; True if it is alive."""
        self.stats["failures_reported"] += 1
        return self._check(name)

    def _lost(self, name: str) -> None:
        with self._lock:
            with self.table.batch():
                left = self.table.drop_function(name)
            info = self.functions.get(name)
            if info is not None:
                info.used = 0
            self.budget.forget_function(name)
            self._unmapped(name, left)
        self.stats["functions_lost"] += 1
        groups: dict[tuple[str, ...], list[ObjectKey]] = {}
        for k, holders in left.items():
            if self._kept(k):
                groups.setdefault(tuple(holders), []).append(k)
        for ks in groups.values():
            self._bg.put(("restore", ks))

    def replica_counts(self) -> dict[str, int]:
        """Number of holders of every cached object (resident by policy or in the table)."""
        with self._lock:
            parts = {k.whole for k in self.table.objects() if k.parts}
            keys = {k for k in self.table.objects() if not k.parts}
            keys |= set(self.policy.contents()) - parts
            return {k.id: len(self.table.get(k)) for k in keys}

    def _ping_loop(self) -> None:
        while not self._stop.wait(self.s.ping_interval):
            for name in list(self.functions):
                if self._stop.is_set():
                    return
                try:
                    self._check(name)
                except Exception:
                    log.exception("ping of %s failed", name)

    def _worker(self) -> None:
        while not self._stop.is_set():
            what, arg = self._bg.get()
            if what == "stop":
                self._bg.task_done()
                return
            try:
                if what in ("restore", "prefetch", "replicate"):
                    with self._lock:
                        ks = [k for k in arg if self._kept(k)]
                    if ks:
                        self.place(ks, restore=what == "restore")
                        self.stats[
                            {
                                "restore": "restored",
                                "prefetch": "prefetched",
                                "replicate": "replicated",
                            }[what]
                        ] += len(ks)
                elif what == "scale":
                    self._scale_evaluator(arg)
                elif what == "end_offer":
                    self._end_offer(*arg)
                elif what == "evict":
                    self._evict(arg)
                elif what == "flush":
                    r = self._invoke(arg, "/objects", timeout=self.s.call_timeout)
                    ids = [o["id"] for o in r.json().get("objects", [])]
                    with self._lock:  # keep what the table says it holds (re-added since)
                        held = {k.id for k in self.table.keys_on(arg)}
                    stale = [ObjectKey.parse(i) for i in ids if i not in held]
                    if stale:
                        self._evict({arg: stale})
            except (EngineError, OverBudget, OpenFaaSError) as exc:  # one line each, no traceback
                self.stats["loads_failed"] += what in ("restore", "prefetch", "replicate")
                log.warning("background %s skipped: %s", what, _one_line(exc))
            except Exception:
                log.exception("background %s failed", what)
            finally:
                self._bg.task_done()

    # -- carrying out policy decisions ----------------------------------------------------
    def _carry_out(self, d: Decision) -> None:
        if d.evict:
            with self._lock, self.table.batch():
                targets = self._unplace(d.evict)
            self._evict_later(targets)
        groups: dict[tuple[str, int], list[ObjectKey]] = {}
        for k in d.prefetch:  # a global model is the base of the next round's updates
            groups.setdefault((k.job, k.round + (k.kind == "global")), []).append(k)
        for ks in groups.values():
            self._bg.put(("prefetch", ks))

    def _evict_later(self, targets: dict[str, list[ObjectKey]]) -> None:
        """Evict after ``evict_grace`` seconds, so queries already routed to the old copies
        finish (the table forgets the objects at once, so no new query is routed there)."""
        if self.s.evict_grace <= 0:
            self._bg.put(("evict", targets))
            return
        with self._lock:
            self._pending_evictions += 1

        def fire() -> None:
            self._bg.put(("evict", targets))
            with self._lock:
                self._pending_evictions -= 1

        t = threading.Timer(self.s.evict_grace, fire)
        t.daemon = True
        t.start()

    def _evict(self, targets: dict[str, list[ObjectKey]]) -> None:
        with self._lock:  # an object placed again on the same function since stays
            targets = {
                f: [k for k in ks if f not in self.table.get(k)] for f, ks in targets.items()
            }
            busy = {f: [k for k in ks if k in self._inflight] for f, ks in targets.items()}
            busy = {f: ks for f, ks in busy.items() if ks}
            targets = {f: [k for k in ks if k not in self._inflight] for f, ks in targets.items()}
        if busy:  # a load of the same object may be landing there: decide again later
            self._evict_later(busy)
        for f, ks in targets.items():
            if not ks:
                continue
            try:
                r = self._invoke(f, "/evict", {"objects": [k.id for k in ks]}, timeout=10)
                if r.status_code == 200:
                    body = r.json()
                    with self._lock:
                        if f in self.functions:
                            self.functions[f].used = int(body.get("bytes", 0))
                        self.budget.report(f, int(body.get("private_bytes", 0)))
                        self._unmapped(f, ks)
            except Exception as exc:
                log.warning("evict on %s failed: %s", f, _one_line(exc))
        self.stats["objects_evicted"] += sum(len(v) for v in targets.values())

    def idle(self) -> bool:
        """True when no background work is pending (tests and benchmarks wait for it)."""
        with self._lock:
            return (
                self._bg.unfinished_tasks == 0
                and not self._inflight
                and self._pending_evictions == 0
            )

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "policy": self.policy.name,
                "objects": len(self.table),
                "resident": len(self.policy),
                "secondaries": self.s.secondaries,
                "functions": {
                    f: {
                        "alive": i.alive,
                        "used_bytes": i.used,
                        "objects": len(self.table.keys_on(f)),
                    }
                    for f, i in self.functions.items()
                },
                "jobs": {j: list(self.catalog.rounds(j)) for j in self.catalog.jobs()},
                "memory_budget": self.budget.describe(),
                "stats": dict(self.stats),
            }


def _one_line(exc: BaseException) -> str:
    """An error as one log line (no traceback): its class and its first line."""
    text = str(getattr(exc, "detail", "") or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _planned(p: Plan) -> dict[str, Any]:
    """What an acquire answer says of the query's plan."""
    return {
        "query": p.query.to_json(),
        "workload": p.query.workload,
        "params": p.params,
        "policy": p.policy,
        "objects": [k.id for k in p.keys],
    }

"""The cache engine: applies the policy, places objects on cache functions, keeps replicas.

State in Redis (shared with the request tracker and a restarted engine): the location table
(:mod:`cache_engine.table`), the catalog of written rounds (``flstore:catalog:<job>``: round ->
clients) and the cache functions (``flstore:functions``: name -> incarnation).

Placement (:mod:`cache_engine.placement`) keeps the objects of one query on the same functions
(a primary and ``k`` secondaries), so a workload always runs where all of its data is; a
function that fills up gets a neighbour, created through the provider API. A query whose
models do not fit one function runs over coordinate parts on several (:mod:`cache_engine.parts`).
What FLStore holds on the node stays within one memory budget (:mod:`cache_engine.budget`):
past it, queries read their models from the cold store through the functions, keeping nothing.
A liveness loop (:mod:`cache_engine.liveness`) pings every function; one that stops answering,
or comes back with a new incarnation (its memory is gone), is dropped from the table and every
object it held is copied again until each has ``1 + k`` holders. Nothing is lost: the cold store
holds everything. Prefetches, evictions and the like run on a worker
(:mod:`cache_engine.background`).

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
from typing import Any

from cache_engine.background import Background
from cache_engine.budget import MemoryBudget, OverBudget
from cache_engine.catalog import MemoryCatalog
from cache_engine.cold_store import ColdStore, ObjectMissing, object_path
from cache_engine.errors import (  # noqa: F401 (the engine's errors, as they always were importable)
    EngineError,
    LoadFailed,
    NoCapacity,
    NoEvaluator,
    RoundMissing,
    one_line,
)
from cache_engine.functions import FunctionInfo
from cache_engine.keys import ObjectKey
from cache_engine.liveness import FUNCTIONS, Liveness
from cache_engine.node_memory import node_budget, store_bytes
from cache_engine.parts import PartPlanner
from cache_engine.placement import Placement
from cache_engine.policies import Decision, make_policy
from cache_engine.queries import Plan, parse_query, plan, run_workload
from cache_engine.settings import EngineSettings
from cache_engine.table import CHANGES, RedisLocationTable
from core.auth import AuthConfigError, bearer, read_token_file
from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS

log = logging.getLogger(__name__)

CATALOG = "flstore:catalog:"
JOBS = "flstore:jobs"
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
    "queries_partly_streamed",
    "queries_streamed",
    "parts_placed",
    "offers_ended",
    "evaluators_scaled",
)
#: rounds whose handoff (where a gateway lends their updates) the engine remembers
HANDOFF_ROUNDS = 256
_TICKET = re.compile(r"^[0-9a-f]{32}$")


def handoff_problem(h: Any) -> str | None:
    """What is wrong with a round's ``handoff`` (None: nothing): ``{"socket": absolute path
    of the gateway's handoff socket, "ticket": 32 hex characters, "node": the gateway's
    node}`` (:mod:`core.objstore.handoff`)."""
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


class CacheEngine(Placement, Liveness, Background):
    """FLStore's cache engine (see module docstring): placement (:mod:`.placement`), liveness
    and replicas (:mod:`.liveness`) and background work (:mod:`.background`) are its parts."""

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
        #: the node's memory budget, with the store's bytes (``cache_engine.budget``)
        root = settings.store_root
        self.budget = MemoryBudget(
            node_budget(settings.node_memory_bytes),
            keep=settings.query_memory_bytes,
            store=None if root is None else lambda: store_bytes(root),
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
            except (OverBudget, NoCapacity, LoadFailed) as exc:  # the cold store can serve it
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
            models = [k for k in p.keys if k.kind != "meta"]
            with self._lock:
                holders = self._live_holders(p.keys)
                in_parts = not holders and self.parts.covered(models) is not None
                if not holders and not in_parts:
                    continue
                d = self.policy.on_request(p.keys, p.policy)
            self._count(d)
            if in_parts:  # one copy of each part: no secondaries to add
                self._carry_out(Decision(prefetch=d.prefetch, evict=d.evict))
            else:
                self._follow_up(p.keys, holders, d)
            counted += 1
        self.stats["touched"] += counted
        return counted

    def _count(self, d: Decision) -> None:
        self.stats["requests"] += 1
        self.stats["hits" if d.hit else "misses"] += 1
        self.stats["key_hits"] += len(d.hits)
        self.stats["key_misses"] += len(d.misses)

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


def _planned(p: Plan) -> dict[str, Any]:
    """What an acquire answer says of the query's plan."""
    return {
        "query": p.query.to_json(),
        "workload": p.query.workload,
        "params": p.params,
        "policy": p.policy,
        "objects": [k.id for k in p.keys],
    }

"""The request tracker: routes queries to the cache functions that hold their data.

Each query gets an id and a record in Redis (``flstore:query:<id>``: status, functions tried,
progress, result or error). The tracker asks the cache engine to make the query's objects
resident (``/v1/acquire``: the policy sees every request, misses load, prefetch starts) and gets
the functions holding all of them, primary first. It invokes the primary's ``/run``; if that does
not answer within ``query_timeout``, fails, or no longer holds the data, the tracker reports the
function to the engine and re-routes to the next holder (a secondary), then re-acquires.

**Kept plans.** A plan the engine made for a query whose objects are cached (its holders) is
kept, and the same query asked again goes straight to a holder: one call to the engine less on
the query path (about a millisecond on a 2-core machine). The engine publishes every change a
plan depends on (the location table, the catalog, evaluators, the functions' addresses) on the
Redis channel :data:`~request_tracker.plans.CHANGES`, naming the job changed (or none, for a change that may touch any
job: a function gone or moved); a message voids the kept plans of that job (or all), and a plan
is reused only in the epoch (messages seen for its job, and for all jobs) in which it was asked
for, while the tracker is subscribed, and for at most :data:`~request_tracker.plans.PLAN_TTL_S`. A plan a message has
not voided yet is still safe: a function answers only when it holds every object named (else
409 ``not_held``), and the tracker then asks the engine as before. The queries answered on kept
plans are told to the engine in batches (``/v1/touch``), so its policy sees every request. The
answer to a metadata-only query that the engine gave from the rounds' metadata (its "plan" is
the result) is kept the same way: asked again, the tracker answers it itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter, deque
from typing import Any

from core.auth import AuthConfigError, bearer, read_token_file
from request_tracker.engine import EngineClient
from request_tracker.errors import TrackerError
from request_tracker.http import Calls, HttpError, HttpTimeout, Reply, reply_body
from request_tracker.plans import KeptPlans
from request_tracker.settings import TrackerSettings

log = logging.getLogger(__name__)

QUERY = "flstore:query:"
FUNCTIONS = "flstore:functions"


class Tracker:
    """Query routing, progress and failover (see module docstring)."""

    def __init__(self, settings: TrackerSettings, redis: Any) -> None:
        self.s = settings
        self.redis = redis  # redis.asyncio.Redis, decode_responses=True
        if settings.function_token_file is None:
            raise AuthConfigError(
                "no function token file: pass --function-token-file PATH (the value of the "
                "runtime secret fedfaas-function-token, which the cache functions require)"
            )
        #: the cache functions' credential, sent on every /run and /ping
        self.function_headers = bearer(
            read_token_file(settings.function_token_file, "function token")
        )
        #: one pool of kept-alive connections to the engine and the runtime (opened in
        #: :meth:`start`, on the running loop)
        tls = settings.tls()
        self.http = Calls(tls.client_context() if tls is not None else None)
        token = (
            read_token_file(settings.engine_token_file, "engine token")
            if settings.engine_token_file
            else None
        )
        self.stats: Counter[str] = Counter()
        #: the engine, with its service credential on every call
        self.engine = EngineClient(settings, self.http, bearer(token) if token else {}, self.stats)
        self.latencies: deque[float] = deque(maxlen=10000)
        self._tasks: set[asyncio.Task[Any]] = set()
        #: query id -> seconds its record is kept, where not ``result_ttl`` (answered queries)
        self._ttl: dict[str, int] = {}
        self._pinger: asyncio.Task[Any] | None = None
        #: records of queries answered in their own request, written in the background
        self._unwritten: dict[str, dict[str, Any]] = {}
        self._writes: set[asyncio.Task[None]] = set()
        self.plans = KeptPlans()
        self._listener: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.http.open()
        if self.s.ping_interval > 0:
            self._pinger = asyncio.create_task(self._ping_loop())
        if self.s.plan_reuse:
            self._listener = asyncio.create_task(self.plans.follow(self.redis))

    async def close(self) -> None:
        if self._pinger:
            self._pinger.cancel()
        if self._listener:
            self._listener.cancel()
        await self.engine.close()
        for t in list(self._tasks):
            t.cancel()
        if self._writes:  # the last answers' records go out before the connection closes
            await asyncio.wait(list(self._writes), timeout=5)
        await self.http.close()

    # -- records --------------------------------------------------------------------------
    async def _record(self, qid: str, *, ttl: int | None = None, **fields: Any) -> None:
        data = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
        key = QUERY + qid
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=data)
            pipe.expire(key, ttl or self._ttl.get(qid, self.s.result_ttl))
            await pipe.execute()

    async def get(self, qid: str) -> dict[str, Any] | None:
        pending = self._unwritten.get(qid)
        if pending is not None:  # answered a moment ago, its record still on its way
            return {"id": qid, **json.loads(json.dumps(pending))}
        raw = await self.redis.hgetall(QUERY + qid)
        if not raw:
            return None
        out: dict[str, Any] = {"id": qid}
        for k, v in raw.items():
            try:
                out[k] = json.loads(v) if k not in ("status", "workload", "job") else v
            except ValueError:
                out[k] = v
        return out

    # -- validation and submission --------------------------------------------------------
    async def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """Ask the engine whether the query can be served (4xx raised as TrackerError)."""
        r = await self.engine.post("/v1/plan", body)
        if r.status_code != 200:
            raise TrackerError(r.status_code, reply_body(r))
        out: dict[str, Any] = r.json()
        return out

    async def submit(self, body: dict[str, Any], wait: bool) -> dict[str, Any]:
        """Accept a query; run it now (``wait``) or in the background."""
        qid = uuid.uuid4().hex
        self.stats["queries"] += 1
        if not wait:
            await self.validate(body)  # bad queries: clear 4xx, nothing recorded
            await self._record(
                qid,
                status="pending",
                workload=str(body.get("workload")),
                job=str(body.get("job")),
                query=body,
                created=time.time(),
                tried=[],
            )
            t = asyncio.create_task(self._run_safely(qid, body))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
            return {"id": qid, "status": "pending"}
        # answered in this very request: its record only needs to outlive the answer briefly
        self._ttl[qid] = self.s.answered_ttl
        try:
            return await self.execute(qid, body, progress=False)
        finally:
            self._ttl.pop(qid, None)

    async def _run_safely(self, qid: str, body: dict[str, Any]) -> None:
        try:
            await self.execute(qid, body)
        except TrackerError:
            pass
        except Exception:
            log.exception("query %s crashed", qid)
            await self._record(qid, status="failed", error={"error": "internal"})

    # -- execution ------------------------------------------------------------------------
    async def execute(
        self, qid: str, body: dict[str, Any], *, progress: bool = True
    ) -> dict[str, Any]:
        """Acquire, route, fail over; return the finished record. With ``progress`` (a
        background query, polled by its id) the record follows every step; without (a query
        answered in its own request, whose id nobody knows before the answer) it is written
        once, finished."""
        t0 = time.perf_counter()
        tried: list[dict[str, Any]] = []
        recorded = False  # the record's head is written
        head: dict[str, Any] = {"job": str(body.get("job")), "query": body}
        last: dict[str, Any] = {"error": "unavailable", "detail": "no cache function answered"}

        async def failed(err: dict[str, Any]) -> None:
            if recorded:
                await self._record(qid, status="failed", error=err, tried=tried)
            elif "workload" in head:
                await self._record(
                    qid, **head, created=time.time(), status="failed", error=err, tried=tried
                )

        key = json.dumps(body, sort_keys=True, separators=(",", ":"))
        job = head["job"]
        kept = self.plans.get(key)
        # a kept plan is tried first, as an attempt of its own: should it be stale, every
        # attempt with a fresh plan is still there
        for attempt in range(-1 if kept is not None else 0, self.s.attempts):
            if attempt < 0 and kept is not None:
                plan = kept
                self.stats["plans_reused"] += 1
            else:
                epoch = self.plans.epoch_of(job)
                try:
                    r = await self.engine.post("/v1/acquire", body)
                except TrackerError as exc:
                    await failed(exc.body)
                    self.stats["failed"] += 1
                    raise
                if r.status_code != 200:
                    err = reply_body(r)
                    await failed(err)
                    self.stats["rejected" if r.status_code < 500 else "failed"] += 1
                    raise TrackerError(r.status_code, err)
                plan = r.json()
                self.plans.keep(key, job, epoch, plan)
            head.update(workload=plan["workload"], hit=plan["hit"])
            if "result" in plan:  # a metadata query the engine answered from what it holds
                return await self._done(
                    qid, head, plan, t0, tried, plan["result"], None, None, recorded=recorded
                )
            if progress and not recorded:
                await self._record(qid, **head, status="running", created=time.time(), tried=tried)
                recorded = True
            for fn in plan["holders"]:
                t1 = time.perf_counter()
                step: dict[str, Any] = {"function": fn, "attempt": max(attempt, 0)}
                if attempt < 0:
                    step["plan"] = "kept"
                tried.append(step)
                if progress:
                    await self._record(qid, status="running", tried=tried)
                run = {
                    "workload": plan["workload"],
                    "params": plan["params"],
                    "objects": plan["objects"],
                    "evaluator": plan.get("evaluator"),
                }
                if plan.get("slices") is not None:  # a round in parts: fn is the reducer
                    run.update(slices=plan["slices"], layout=plan.get("layout"))
                long = plan.get("slices") is not None or plan.get("evaluator") is not None
                timeout = self.s.long_query_timeout if long else self.s.query_timeout
                try:
                    resp = await self._run(
                        fn, (plan.get("endpoints") or {}).get(fn), run, step, timeout
                    )
                except HttpError as exc:
                    step.update(
                        outcome="timeout" if isinstance(exc, HttpTimeout) else "unreachable",
                        detail=str(exc)[:200],
                    )
                    self.plans.forget(key)
                    self.stats["reroutes"] += 1
                    await self.engine.report_failed(fn)
                    continue
                step["seconds"] = time.perf_counter() - t1
                if resp.status_code == 200:
                    out = resp.json()
                    step["outcome"] = "ok"
                    if attempt < 0:  # the engine did not see this request: tell its policy
                        self.engine.touch(body)
                    return await self._done(
                        qid,
                        head,
                        plan,
                        t0,
                        tried,
                        out["result"],
                        fn,
                        out.get("compute_s"),
                        recorded=recorded,
                    )
                err = reply_body(resp)
                step.update(outcome=f"http_{resp.status_code}", error=err.get("error"))
                self.plans.forget(key)
                if resp.status_code == 409 and err.get("error") == "not_held":
                    # evicted meanwhile: fix the table, re-acquire (a reducer names the
                    # function whose part was missing)
                    last = err
                    named = err.get("function")
                    lacking = named if isinstance(named, str) else fn
                    await self.engine.report_missing(lacking, err.get("missing", []))
                    continue
                if 400 <= resp.status_code < 500 and resp.status_code not in (404, 429):
                    # the workload rejected its input: a property of the query, not of the function
                    await failed(err)
                    self.stats["rejected"] += 1
                    raise TrackerError(resp.status_code, err)
                last = err
                self.stats["reroutes"] += 1
                await self.engine.report_failed(fn)
        await failed(last)
        self.stats["failed"] += 1
        raise TrackerError(
            503,
            {
                "error": "unavailable",
                "detail": f"no holder answered after {self.s.attempts} attempts",
                "tried": tried,
            },
        )

    async def _done(
        self,
        qid: str,
        head: dict[str, Any],
        plan: dict[str, Any],
        t0: float,
        tried: list[dict[str, Any]],
        result: Any,
        function: str | None,
        compute_s: float | None,
        *,
        recorded: bool,
    ) -> dict[str, Any]:
        """Count a finished query, write its record and return the answer. ``head``: the
        record's head (workload, job, query, hit); ``function`` is the cache function that
        answered (None: the engine answered from what it holds); where nothing was
        ``recorded`` yet the record is written whole, in one write."""
        latency = time.perf_counter() - t0
        self.latencies.append(latency)
        self.stats["completed"] += 1
        self.stats["hits" if plan["hit"] else "misses"] += 1
        done = {
            "status": "done",
            "result": result,
            "tried": tried,
            "function": function,
            "latency_s": latency,
            "compute_s": compute_s,
            "engine_s": plan.get("engine_s"),
            "loaded": plan.get("loaded", 0),
            "plan_kept": bool(plan.get("kept")),
        }
        if recorded:
            await self._record(qid, **done)
        else:  # written while the answer goes back; get() serves it from here meanwhile
            rec = {**head, "created": time.time(), **done}
            self._unwritten[qid] = rec
            ttl = self._ttl.get(qid, self.s.result_ttl)
            t = asyncio.create_task(self._write(qid, rec, ttl))
            self._writes.add(t)
            t.add_done_callback(self._writes.discard)
        return {"id": qid, **head, **done}

    async def _write(self, qid: str, rec: dict[str, Any], ttl: int) -> None:
        try:
            await self._record(qid, ttl=ttl, **rec)
        except Exception:
            log.exception("record of query %s not written", qid)
        finally:
            self._unwritten.pop(qid, None)

    async def _run(
        self,
        fn: str,
        direct: str | None,
        run: dict[str, Any],
        step: dict[str, Any],
        timeout: float,
    ) -> Reply:
        """``POST /run`` on cache function ``fn``: at its replica's own address where the
        engine knows one (one hop less than through the gateway), else, or when that address
        does not answer (the replica restarted elsewhere), through the gateway."""
        if direct and self.s.direct_functions:
            try:
                reply = await self.http(
                    "POST", f"{direct}/run", run, self.function_headers, timeout
                )
                step["via"] = "direct"
                return reply
            except HttpTimeout:
                raise  # the function is there, and busy: the gateway would not do better
            except HttpError as exc:
                step["direct_failed"] = str(exc)[:200]
        step["via"] = "gateway"
        return await self.http(
            "POST",
            f"{self.s.runtime_url}/function/{fn}/run",
            run,
            self.function_headers,
            timeout,
        )

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.s.ping_interval)
            try:
                names = await self.redis.hkeys(FUNCTIONS)
                for fn in names:
                    try:
                        r = await self.http(
                            "GET",
                            f"{self.s.runtime_url}/function/{fn}/ping",
                            None,
                            self.function_headers,
                            2.0,
                        )
                        ok = r.status_code == 200
                    except HttpError:
                        ok = False
                    self.stats["pings"] += 1
                    if not ok:
                        self.stats["ping_failures"] += 1
                        await self.engine.report_failed(fn)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("ping loop")

    def metrics(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        return {
            **self.stats,
            "latency_p50_s": pct(0.5),
            "latency_p99_s": pct(0.99),
            "in_flight": len(self._tasks),
            "plans_kept": len(self.plans),
            # queries answered on kept plans that the engine's policy has not seen yet
            "touches_pending": self.engine.touches_pending,
        }

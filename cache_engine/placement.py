"""Where the cache engine puts objects: on which cache functions, within their capacity and
the node's memory budget, created through the provider API as the cache grows.

:meth:`Placement.ensure` places a query's objects together on ``copies`` functions (one on
the query path; the secondaries follow in the background), waiting for loads of the same
objects already under way; a function that fills up gets a neighbour, and when no more may be
created the policy picks victims. Loads past the node's memory budget
(:mod:`cache_engine.budget`) do not start (:class:`~cache_engine.budget.OverBudget`).
:meth:`Placement.place` places what the policy prefetches or restores, in coordinate parts
when too big for one function (:mod:`cache_engine.parts`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from cache_engine.budget import OverBudget
from cache_engine.errors import (
    EngineError,
    FunctionsUnavailable,
    LoadFailed,
    NoCapacity,
    one_line,
)
from cache_engine.functions import FunctionInfo
from cache_engine.keys import ObjectKey
from cache_engine.parts import parts_needed
from cache_engine.state import EngineState
from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaSError, function_deployment

log = logging.getLogger(__name__)


class Placement(EngineState):
    """The cache engine's placement (see the module)."""

    def ensure(
        self,
        keys: Sequence[ObjectKey],
        copies: int | None = None,
        _room_tries: int = 3,
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
                over = False
            except OverBudget:
                self._unbook(booked)
                if _room_tries <= 0:
                    raise
                over = True
            if not over:
                for ks in todo.values():
                    for k in ks:
                        self._inflight.setdefault(k, threading.Event())
        if over:  # room by the policy's order (never these keys), then place again
            self.make_budget_room(reserved, keys)
            return self.ensure(keys, copies, _room_tries=_room_tries - 1)
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
            log.warning("load on %s failed: %s", f1, one_line(err1))
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

    def make_budget_room(
        self, nbytes: int, keep: Sequence[ObjectKey], *, partial: bool = False
    ) -> None:
        """Evict, in the policy's order, what the budget needs for ``nbytes`` more (never
        ``keep``); :class:`OverBudget` when even that is not enough (nothing is evicted).
        ``partial`` evicts what there is even then: with ``nbytes`` 0, FLStore gives back what
        the store grew into (:meth:`~cache_engine.budget.MemoryBudget.overdraft`)."""
        short = nbytes - self.budget.room() + self.budget.overdraft()
        if short <= 0:
            return
        spare = {k.whole for k in keep}
        with self._lock:
            held = {k.whole for k in self.table.objects()} - spare
            order = self.policy.eviction_order(held)
            victims: list[ObjectKey] = []
            freed = 0
            for k in order:
                if freed >= short:
                    break
                private = [x for x in [k, *self.table.parts_of(k)] if x in self.table.objects()]
                freed += sum(
                    self._size(x) * len(self.table.get(x))
                    for x in private
                    if not (x.kind == "update" and (x.job, x.round) in self.handoffs)
                )
                victims.append(k)
            if freed < short and not partial:
                self.stats["over_budget"] += 1
                raise OverBudget(
                    f"{nbytes} bytes do not fit the node's memory budget "
                    f"({self.budget.used()} of {self.budget.limit} bytes used, "
                    f"{freed} more could be evicted)"
                )
            if not victims:
                return
            self.policy.forget(victims)
            targets = self._unplace(victims)
        self.stats["evicted_for_budget"] += len(victims)
        if partial:
            log.info(
                "memory budget: %d bytes past it (the store holds %s); evicting %d objects",
                short,
                self.budget.describe()["store_bytes"],
                len(victims),
            )
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
        why = self.parts.place(models, metas, n)
        if why:  # what the budget or the functions did not take is read from MinIO
            self.stats["loads_failed"] += 1
            log.warning(
                "placing the parts of %s round %d partly skipped: %s",
                models[0].job,
                models[0].round,
                why,
            )

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
                info.said(body)
            self.budget.report_answer(fn, body, body.get("bytes", 0))
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
        held = self.metas.get(key) if key.kind == "meta" else None
        if held is not None:  # what the function holds: the normalized document, as JSON
            return len(json.dumps(held))
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

    def _forget_undeployed(self) -> None:
        """At the cap, forget the functions that died and that the provider no longer has (a
        runtime restarted: its functions do not survive it, and no one deploys the engine's
        again), so that their places go to new ones. Their objects left the location table
        when they died. The provider is asked outside the lock."""
        with self._lock:
            if len(self.functions) < self.s.max_functions:
                return
            # not alive, once alive (a function still deploying has no incarnation yet)
            down = [f for f, i in self.functions.items() if not i.alive and i.incarnation]
        gone = []
        for f in down:
            try:
                if self.openfaas.function(f) is None:
                    gone.append(f)
            except OpenFaaSError:  # the provider does not answer: nothing is known
                return
        with self._lock:
            gone = [f for f in gone if f in self.functions and not self.functions[f].alive]
            for f in gone:
                del self.functions[f]
        if gone:
            log.warning(
                "cache functions %s are no longer deployed (the runtime restarted without "
                "them): their places go to new functions",
                ", ".join(gone),
            )

    def _new_function(self) -> str:
        self._forget_undeployed()
        with self._lock:
            if len(self.functions) >= self.s.max_functions:
                down = sorted(f for f, i in self.functions.items() if not i.alive)
                if down:  # the runtime restarting them (its SIGKILL takes every replica)
                    raise FunctionsUnavailable(
                        f"{len(down)} of the {self.s.max_functions} cache functions do not "
                        f"answer now ({', '.join(down[:4])}{', ...' if len(down) > 4 else ''}); "
                        "ask again",
                        functions=len(self.functions),
                        down=len(down),
                    )
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
            # a query's large transient buffers (sub-models, streamed chunks, parts' answers)
            # are mapped and given back at once, not kept in per-thread heaps: the node's
            # memory budget counts the functions' private memory
            "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
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

"""What the cache engine does off the query path, one task at a time on its worker thread:
prefetches, restorations and secondaries (:meth:`Placement.place`), evictions after a grace,
scaling a job's evaluator function, ending a gateway's offer once the round's placement has
claimed what it keeps. A task that fails is one line of the log (counted), never a traceback,
unless it is a bug.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from cache_engine.budget import OverBudget
from cache_engine.errors import EngineError, one_line
from cache_engine.evaluators import evaluator_replicas, function_spec_problem
from cache_engine.keys import ObjectKey
from cache_engine.policies import Decision
from cache_engine.state import EngineState
from core.objstore.handoff import HandoffError, end_offer
from core.openfaas import OpenFaaSError

log = logging.getLogger(__name__)

#: how long an offer the engine cannot end is counted against the budget (the gateway's
#: default ``handoff_ttl_s``)
OFFER_TTL_GUESS_S = 30.0


class Background(EngineState):
    """The engine's background tasks (see the module)."""

    def _follow_up(self, keys: Sequence[ObjectKey], holders: list[str], d: Decision) -> None:
        """What a request leaves to the background: the secondaries its objects lack, and the
        policy's prefetch and evictions."""
        if len(holders) < 1 + self.s.secondaries:
            self._bg.put(("replicate", list(keys)))
        self._carry_out(Decision(prefetch=d.prefetch, evict=d.evict))

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
                log.warning("background %s skipped: %s", what, one_line(exc))
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
                            self.functions[f].said(body)
                        self.budget.report_answer(f, body)
                        self._unmapped(f, ks)
            except Exception as exc:
                log.warning("evict on %s failed: %s", f, one_line(exc))
        self.stats["objects_evicted"] += sum(len(v) for v in targets.values())

    def idle(self) -> bool:
        """True when no background work is pending (tests and benchmarks wait for it)."""
        with self._lock:
            return (
                self._bg.unfinished_tasks == 0
                and not self._inflight
                and self._pending_evictions == 0
            )

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

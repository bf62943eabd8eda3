"""The cache engine's view of its functions' health, and the copies it restores.

A liveness loop pings every cache function; one that stops answering (refused at once, or
``dead_after`` timeouts in a row), or comes back with a new incarnation (its memory is gone), is
dropped from the location table and every object it held is copied again until each has
``1 + k`` holders (one for a part). A function that says it lacks objects the table gives it is
believed. Nothing is lost: the cold store holds everything.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from cache_engine.functions import FunctionInfo
from cache_engine.keys import ObjectKey
from cache_engine.state import EngineState
from cache_engine.table import CHANGES
from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaSError

log = logging.getLogger(__name__)

FUNCTIONS = "flstore:functions"
#: a cache function's own address it may report (loopback or a host, a port, no path; https
#: where the runtime's replicas serve TLS)
_DIRECT = re.compile(r"^https?://[A-Za-z0-9.-]{1,253}:[0-9]{1,5}$")


class Liveness(EngineState):
    """Pings, failures, losses and restoration (see the module)."""

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
            if changed:  # a new process counts its loads from 0
                info.seq = -1
            info.said(body)
            self.budget.report_answer(name, body, info.used)
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
                info.used, info.seq = 0, -1
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
            if self.budget.overdraft():  # the store grew into FLStore's share: give it back
                try:
                    self.make_budget_room(0, (), partial=True)
                except Exception:
                    log.exception("giving memory back to the store failed")

"""Kept plans: the engine's plan for a query, reused for the same query until a change voids it.

See :mod:`request_tracker.tracker` for the rule. The engine publishes every change a plan
depends on on the Redis channel :data:`CHANGES`, naming the job changed (or none, for a change
that may touch any job); a message voids the kept plans of that job (or all). A plan is reused
only in the epoch (messages seen for its job, and for all jobs) in which it was asked for, while
subscribed, and for at most :data:`PLAN_TTL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)

#: the engine's change messages (``cache_engine.table.CHANGES``)
CHANGES = "flstore:changes"
#: the longest a plan is kept (a bound should a change message be lost with the subscription)
PLAN_TTL_S = 5.0
#: the most plans kept (all are forgotten when one more would not fit)
MAX_PLANS = 4096

Epoch = tuple[int, int]


class KeptPlans:
    """Plans by query (its canonical JSON), voided by the engine's change messages."""

    def __init__(self) -> None:
        #: query -> (job, epoch it was asked in, monotonic time, plan)
        self._plans: dict[str, tuple[str, Epoch, float, dict[str, Any]]] = {}
        #: change messages for every job seen since start (and subscriptions made), and for
        #: each job
        self._epoch = 0
        self._job_epochs: Counter[str] = Counter()
        #: subscribed to CHANGES: only then is a plan reused
        self.listening = False

    def __len__(self) -> int:
        return len(self._plans)

    def epoch_of(self, job: str) -> Epoch:
        return self._epoch, self._job_epochs[job]

    def get(self, key: str) -> dict[str, Any] | None:
        """The plan kept for query ``key`` where it is still good, as a plan of a request
        that loaded nothing (the engine's own figures of the first request left out)."""
        if not self.listening:
            return None
        entry = self._plans.get(key)
        if entry is None:
            return None
        job, epoch, made, plan = entry
        if epoch != self.epoch_of(job) or time.monotonic() - made > PLAN_TTL_S:
            del self._plans[key]
            return None
        return {
            **plan,
            "hit": True,
            "loaded": 0,
            "engine_s": None,
            "misses": [],
            "prefetch": [],
            "evict": [],
            "kept": True,
        }

    def keep(self, key: str, job: str, epoch: Epoch, plan: dict[str, Any]) -> None:
        """Keep the plan of a query of ``job`` (asked for in ``epoch``, and no change of that
        job seen since): one that routes to functions, or the answer to a metadata query the
        engine gave from the rounds' metadata (the same query on the same rounds gives the
        same answer until a change)."""
        if not self.listening or epoch != self.epoch_of(job):
            return
        if "result" not in plan and not plan.get("holders"):
            return
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[key] = (job, epoch, time.monotonic(), plan)

    def forget(self, key: str) -> None:
        """Drop the plan of one query (it led to a function that failed or lacked data)."""
        self._plans.pop(key, None)

    def changed(self, job: str) -> None:
        """A change of ``job`` ("": of any job): its kept plans are void."""
        if job:
            self._job_epochs[job] += 1
            for k in [k for k, e in self._plans.items() if e[0] == job]:
                del self._plans[k]
        else:
            self._epoch += 1
            self._plans.clear()

    async def follow(self, redis: Any) -> None:
        """Follow the engine's change messages on ``redis`` (``redis.asyncio``) until
        cancelled: each voids the kept plans of its job (or all). Plans are kept only while
        subscribed; a broken subscription forgets them all and is made again."""
        while True:
            pubsub = redis.pubsub()
            try:
                await pubsub.subscribe(CHANGES)
                async for msg in pubsub.listen():
                    if msg.get("type") == "message":
                        self.changed(str(msg.get("data") or ""))
                    else:  # subscribed (again): anything may have changed meanwhile
                        self.changed("")
                        self.listening = msg.get("type") == "subscribe"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("no change messages from the engine (%s); plans are not kept", exc)
            finally:
                self.listening = False
                self._plans.clear()
                with contextlib.suppress(Exception):  # the connection may be broken already
                    await pubsub.aclose()
            await asyncio.sleep(1.0)

"""The node gateway's background work: tasks whose failures are seen, and journal operations
tried again until Redis takes them.

Every coroutine the gateway starts without awaiting it (a round's publication, a partial's
forward, a slot's journal record, a checkpoint, a notice to the cache engine, the housekeeping
loop) runs as a task of :class:`Background`. The set holds each task until it ends, and no
longer: it stays the size of the work in flight however many rounds a job runs. A task that ends
by an exception is logged with its traceback and counted in
``fedfaas_gateway_task_failures_total{task}``: none is lost silently.

:class:`JournalRetry` runs one journal operation until Redis takes it. Each failure (Redis down,
a refused command, no answer) is logged and counted in
``fedfaas_gateway_journal_retries_total{op}``, and tried again after a wait that doubles from
50 ms up to ``retry_max_s``. It gives up only when the work no longer matters (the gateway
stops, or the job or round it belongs to is gone): :class:`Abandoned`. What the operation
protects stays held meanwhile, so a gateway killed while Redis is away recovers from the
journal when it starts again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from prometheus_client import Counter
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the first wait before a failed journal operation is tried again (then doubled each time)
FIRST_DELAY_S = 0.05
#: what a journal operation raises when Redis did not take it (anything else is a bug, and
#: propagates: :class:`~gateway.journal.NotRoot` is an answer, not a failure)
JOURNAL_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class Abandoned(Exception):
    """The work a retried operation belonged to is gone: the gateway stops, or its job or round
    ended meanwhile. Nothing was lost: what it protects is in the journal or no longer needed."""


class Background:
    """The gateway's tasks in flight (see the module docstring).

    Parameters
    ----------
    failures
        ``fedfaas_gateway_task_failures_total``, labelled ``task``: the part of a task's name
        before its first ``:`` (``publish:j1/3`` counts as ``publish``).
    """

    def __init__(self, failures: Counter) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self._failures = failures

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task named ``name`` (``kind:detail``), held until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or isinstance(exc, Abandoned):
            return
        self._failures.labels(task=task.get_name().split(":", 1)[0]).inc()
        log.error("background task %s failed", task.get_name(), exc_info=exc)

    async def stop(self, timeout: float) -> list[asyncio.Task[Any]]:
        """Cancel every task and wait up to ``timeout`` seconds for them; those left running."""
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        if not tasks:
            return []
        _, left = await asyncio.wait(tasks, timeout=timeout)
        return list(left)


class JournalRetry:
    """Journal operations tried again until Redis takes them (see the module docstring).

    Parameters
    ----------
    retries
        ``fedfaas_gateway_journal_retries_total``, labelled ``op``.
    max_delay
        The longest wait between two tries (the gateway's ``retry_max_s``).
    stopping
        Set when the gateway stops: the operation is abandoned at its next failure.
    """

    def __init__(self, retries: Counter, max_delay: float, stopping: threading.Event) -> None:
        self._retries = retries
        self.max_delay = max_delay
        self._stopping = stopping

    async def __call__(
        self, op: str, call: Callable[[], Awaitable[T]], still: Callable[[], bool]
    ) -> T:
        """``await call()`` until it returns; ``op`` names it in the logs and the metric.

        Raises
        ------
        Abandoned
            Before a try, the gateway stops or ``still()`` is false (the work is gone).
        """
        delay, tries = FIRST_DELAY_S, 0
        while True:
            if self._stopping.is_set() or not still():
                raise Abandoned(f"journal {op}: its work ended before Redis took it")
            try:
                return await call()
            except JOURNAL_ERRORS as exc:
                tries += 1
                self._retries.labels(op=op).inc()
                log.warning(
                    "journal %s failed (try %d: %s: %s); what it records stays held, trying "
                    "again in %.2f s",
                    op,
                    tries,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_delay)

"""The tracker's calls to the cache engine: plans, reports of failed functions and missing
objects, and the queries answered on kept plans, told in batches (``/v1/touch``) so that the
engine's policy sees every request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from request_tracker.errors import TrackerError
from request_tracker.http import Calls, HttpError, Reply
from request_tracker.settings import TrackerSettings

log = logging.getLogger(__name__)

#: queries answered on kept plans reach the engine in batches: the first waits this long
TOUCH_DELAY_S = 0.05
#: the most queries in one batch (the engine takes up to ``cache_engine.service.MAX_TOUCH``)
TOUCH_BATCH = 500


class EngineClient:
    """Calls to the engine at ``settings.engine_url`` with its service credential."""

    def __init__(
        self,
        settings: TrackerSettings,
        calls: Calls,
        headers: dict[str, str],
        stats: Counter[str],
    ) -> None:
        self.s = settings
        self.calls = calls
        self.headers = headers
        self.stats = stats
        #: queries answered on kept plans, not told to the engine yet
        self._touches: list[dict[str, Any]] = []
        self._toucher: asyncio.Task[None] | None = None
        self._touches_in_flight = 0

    @property
    def touches_pending(self) -> int:
        """Queries answered on kept plans that the engine's policy has not seen yet."""
        return len(self._touches) + self._touches_in_flight

    async def close(self) -> None:
        if self._toucher:
            self._toucher.cancel()
        if self._touches:  # the last answers' requests still reach the policy
            await self._send_touches(at_once=True)

    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        """``POST`` to the engine; a refused or broken connection (the engine restarting under
        the supervisor) is tried again for ``engine_wait`` seconds, then a 503."""
        deadline = time.monotonic() + self.s.engine_wait
        delay = 0.1
        while True:
            try:
                return await self.calls(
                    "POST", f"{self.s.engine_url}{path}", body, self.headers, self.s.engine_timeout
                )
            except HttpError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stats["engine_unavailable"] += 1
                    raise TrackerError(
                        503,
                        {
                            "error": "engine_unavailable",
                            "detail": f"the cache engine at {self.s.engine_url} did not answer "
                            f"for {self.s.engine_wait:g} s ({type(exc).__name__}); ask again",
                        },
                    ) from exc
                await asyncio.sleep(min(delay, left))
                delay = min(2 * delay, 1.0)

    async def report_failed(self, fn: str) -> None:
        """Tell the engine that cache function ``fn`` did not answer (best effort)."""
        try:
            await self.calls(
                "POST", f"{self.s.engine_url}/v1/functions/{fn}/failed", None, self.headers, 10
            )
        except HttpError as exc:
            log.warning("could not report %s to the engine: %s", fn, exc)

    async def report_missing(self, fn: str, objects: list[Any]) -> None:
        """Tell the engine that ``fn`` no longer holds ``objects`` (best effort)."""
        try:
            await self.calls(
                "POST",
                f"{self.s.engine_url}/v1/functions/{fn}/missing",
                {"objects": objects},
                self.headers,
                10,
            )
        except HttpError as exc:
            log.warning("could not report missing objects on %s: %s", fn, exc)

    def touch(self, body: dict[str, Any]) -> None:
        """Count a query answered on a kept plan; sent with the next batch."""
        self._touches.append(body)
        if self._toucher is None:
            self._toucher = asyncio.create_task(self._send_touches())

    async def _send_touches(self, *, at_once: bool = False) -> None:
        """Tell the engine the queries answered on kept plans (``POST /v1/touch``), in
        batches; its policy then sees them as requests. Best effort: a batch the engine does
        not take is logged and dropped (the answers are not affected)."""
        if not at_once:
            await asyncio.sleep(TOUCH_DELAY_S)
        self._toucher = None
        while self._touches:
            batch, self._touches = self._touches[:TOUCH_BATCH], self._touches[TOUCH_BATCH:]
            self._touches_in_flight += len(batch)
            try:
                r = await self.calls(
                    "POST", f"{self.s.engine_url}/v1/touch", {"queries": batch}, self.headers, 10
                )
                if r.status_code != 200:
                    log.warning("the engine refused %d touches: HTTP %d", len(batch), r.status_code)
            except HttpError as exc:
                log.warning("%d touches not told to the engine: %s", len(batch), exc)
            finally:
                self._touches_in_flight -= len(batch)
            self.stats["touches_sent"] += len(batch)

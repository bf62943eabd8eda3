"""Which enrolled clients train in a round: at random, or by Oort's utility from FLStore.

A job's ``selection`` is ``"random"`` (the default) or ``"oort"``. Oort (Lai et al., OSDI'21)
ranks clients by the statistical utility of their last updates (loss and sample count) and
penalises those slower than a preferred duration, exploring clients it has not seen yet; its
answer is FLStore's ``oort`` workload (:mod:`flstore_workloads.scheduling`), computed in the
cache function that already holds the previous rounds' client metadata. So the control plane
asks the request tracker, as an analyst would, for round ``n``'s ``k`` clients among the
job's eligible ones, then places them (LIFL's placement). Round 1 has no history and is
always random.

When the tracker gives no answer (not configured, unreachable, an error such as client
metadata without ``duration_s``, the previous round not ingested within the timeout), the
round is selected at random and the round's ``selection_note`` says why: a job never stalls on
its scheduler. Only "not ingested yet" is asked again: the coordinator waits for the answer
before it opens the round (holding its lock), so a tracker that is down costs one refused
connection, not the timeout.

The same tracker answers the debugging loop: a job created with ``drop_flagged`` (a
malicious-client workload, ``multi-krum`` or ``cosine-to-aggregate``, and its parameters) has
the control plane ask, before each round from round 2, which clients that workload flags in
the round just ended (:meth:`OortScheduler.flagged`); those clients are dropped from the job's
later rounds before aggregation (the coordinator keeps them out of the selection and the
gateways refuse their uploads; each round's ``meta.json`` names them under ``excluded``),
though never so many that fewer than the job's goal stay selectable.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

#: what a job's ``selection`` may be
SELECTIONS = ("random", "oort")

#: FLStore workloads whose answer names ``flagged`` clients (a job's ``drop_flagged``)
FLAGGING_WORKLOADS = ("multi-krum", "cosine-to-aggregate")

#: tracker errors that mean "the cache engine has not ingested that round yet": asked again
#: until the timeout (the codes ``client.sdk.NOT_INGESTED`` retries too)
NOT_INGESTED = frozenset({"round_not_written", "unknown_job"})


@dataclass(frozen=True)
class Selection:
    """A round's clients and how they were chosen.

    ``method`` is ``"random"`` or ``"oort"``; ``note`` says why a job that asked for Oort
    got a random round ("" otherwise).
    """

    clients: list[str]
    method: str = "random"
    note: str = ""


def random_selection(pool: Sequence[str], want: int, seed: int, note: str = "") -> Selection:
    """``want`` of ``pool`` drawn with ``seed`` (sorted): the same job and round draw the
    same clients."""
    return Selection(sorted(random.Random(seed).sample(list(pool), want)), "random", note)


class SchedulerUnavailable(Exception):
    """The tracker gave no usable Oort answer; the message says why (it becomes the note)."""


class _NotYet(SchedulerUnavailable):
    """A failure that may pass: asked again until the timeout."""


class OortScheduler:
    """Asks FLStore's request tracker (``POST /v1/queries?wait=true``) for Oort's selection.

    Parameters
    ----------
    tracker_url
        The request tracker, e.g. ``http://127.0.0.1:8092``.
    token
        A tracker token of the analyst scope (queries only read).
    timeout_s
        How long one selection may take (asking again while the previous round is not
        ingested yet included).
    window
        Rounds of client metadata Oort reads (its ``R``).
    """

    def __init__(
        self,
        tracker_url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        window: int = 10,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.url = tracker_url.rstrip("/") + "/v1/queries"
        self.timeout_s = timeout_s
        self.window = window
        self._http = httpx.AsyncClient(
            transport=transport, headers={"Authorization": f"Bearer {token}"}, verify=verify
        )

    async def select(
        self, job: str, number: int, pool: Sequence[str], want: int, seed: int
    ) -> list[str]:
        """Oort's ``want`` clients of ``pool`` for round ``number`` (>= 2) of ``job``.

        Raises
        ------
        SchedulerUnavailable
            No answer in time, an error answer, or an answer that is not ``want`` distinct
            clients of ``pool``.
        """
        query: dict[str, Any] = {
            "workload": "oort",
            "job": job,
            "params": {
                "round": number,
                "k": want,
                "candidates": list(pool),
                "window": self.window,
                "seed": seed,
            },
        }
        result = await self._answer(query)
        selected = result.get("selected")
        if not isinstance(selected, list):
            raise SchedulerUnavailable("the tracker's oort answer has no 'selected' list")
        return self._checked([str(c) for c in selected], pool, want)

    async def flagged(
        self, job: str, number: int, workload: str, params: dict[str, Any]
    ) -> list[str]:
        """The clients FLStore's ``workload`` flags in round ``number`` of ``job`` (its
        ``flagged`` list), asked with ``params`` and ``round``.

        Raises
        ------
        SchedulerUnavailable
            No answer in time, an error answer, or one without a ``flagged`` list.
        """
        query = {"workload": workload, "job": job, "params": {**params, "round": number}}
        flagged = (await self._answer(query)).get("flagged")
        if not isinstance(flagged, list):
            raise SchedulerUnavailable(f"the tracker's {workload} answer has no 'flagged' list")
        return [str(c) for c in flagged]

    async def _answer(self, query: dict[str, Any]) -> dict[str, Any]:
        """The workload's ``result``, asked again while its rounds are not in FLStore yet."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                left = deadline - time.monotonic()
                return await self._ask(query, max(left, 0.5))
            except _NotYet as exc:
                if time.monotonic() + 0.25 > deadline:
                    raise SchedulerUnavailable(str(exc)) from None
            await asyncio.sleep(0.25)

    async def _ask(self, query: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One query: the workload's ``result``. Raises :class:`_NotYet` when the rounds it
        reads have not reached FLStore yet (the gateways hand a round over just after
        publishing it), else :class:`SchedulerUnavailable`."""
        try:
            resp = await self._http.post(
                self.url, params={"wait": "true"}, json=query, timeout=timeout
            )
        except httpx.HTTPError as exc:
            # not asked again: the coordinator waits for this answer, and a random round
            # is better than a control plane stalled on a tracker that is down
            raise SchedulerUnavailable(
                f"request tracker unreachable at {self.url}: {exc!r}"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        if resp.status_code == 200:
            result = body.get("result")
            if not isinstance(result, dict):
                raise SchedulerUnavailable(
                    f"the tracker's {query['workload']} answer has no result"
                )
            return result
        error = str(body.get("error", f"http_{resp.status_code}"))
        why = f"tracker answered {resp.status_code} {error}: {body.get('detail', '')}"
        raise (_NotYet if error in NOT_INGESTED else SchedulerUnavailable)(why)

    @staticmethod
    def _checked(selected: list[str], pool: Sequence[str], want: int) -> list[str]:
        if len(selected) != want or len(set(selected)) != want or not set(selected) <= set(pool):
            raise SchedulerUnavailable(
                f"the tracker's oort answer is not {want} distinct eligible clients"
            )
        return selected

    async def aclose(self) -> None:
        await self._http.aclose()

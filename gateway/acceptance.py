"""An upload's journal record, written so that its answer is never a guess.

An update is acknowledged (202) only once its record is in the journal, and its object is
freed only when no record names it. A journal write whose answer did not come back (the
connection broke after Redis took it, or before; a timeout) leaves both possible.
:func:`journal_update` resolves it before anything is answered or freed:

- no answer: the same write again, until Redis answers it (:class:`~gateway.background.
  JournalRetry`: logged, counted in ``fedfaas_gateway_journal_retries_total{op="accept"}``).
  The record names the update's object (its unguessable key), so the write is idempotent
  (:meth:`gateway.journal.Journal.accept`): written if the lost one had not landed, and
  written too if it had, never a duplicate of itself;
- Redis answered and refused the write (``NOPERM``, ``OOM``, ``READONLY``: that try wrote
  nothing): the client's record is read back, as a client library configured to try a
  broken write again may have written it before; ours there, the update is accepted; none
  there, the upload is answered 503 ``journal_unavailable`` with ``Retry-After`` and its
  object freed.

The same holds for taking a record back (:func:`withdraw`, a round that closed while the update
was uploading). If the gateway stops, or the job goes, before Redis answers, the outcome is
still unknown: :class:`Unresolved`, and the object stays in the store. The job's end frees it
with the store; a restarted gateway adopts it if its record is in the journal and sweeps it if
not (:mod:`gateway.recovery`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from redis.exceptions import ResponseError

from gateway.background import JOURNAL_ERRORS, Abandoned, JournalRetry
from gateway.bodies import RETRY_AFTER_S
from gateway.errors import RetryLater
from gateway.journal import Accepted, Journal

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "Acceptor",
    "JournalRefused",
    "NamedJob",
    "UploadInFlight",
    "Unresolved",
    "journal_update",
    "withdraw",
]


class NamedJob(Protocol):
    """The job an acceptance is for: its name, and itself (is it still the node's job?)."""

    @property
    def name(self) -> str: ...


class Acceptor(Protocol):
    """What an acceptance needs of its node gateway: the journal, the retry that runs a journal
    write until Redis answers, whether the gateway stops, and its jobs (is the job still
    there?)."""

    @property
    def journal(self) -> Journal: ...

    @property
    def retry(self) -> JournalRetry: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def jobs(self) -> Mapping[str, object]: ...


class JournalRefused(RetryLater):
    """503 + ``Retry-After``: Redis refused the update's record and holds none of this client
    for the round; nothing of the upload is kept, the client sends it again later."""

    code = "journal_unavailable"


class UploadInFlight(RetryLater):
    """503 + ``Retry-After``: an upload of the same client and round is still being received
    or journaled on this node, and may yet fail: a 409 ``duplicate_client`` would tell the
    client it counts. Asked again later, the node knows."""

    code = "upload_in_flight"


class Unresolved(Exception):
    """The gateway stops, or the job went, before Redis answered whether the record is there:
    the object stays in the store, where the journal decides its fate (see the module
    docstring). Never answered as an acknowledgement."""


async def journal_update(
    gw: Acceptor, job: NamedJob, rnd: int, client: str, record: dict[str, Any], cap: int
) -> Accepted:
    """Write ``client``'s ``record`` of round ``rnd`` (:meth:`gateway.journal.Journal.accept`)
    and return what Redis did, resolved when its answer was lost (see the module docstring).

    Raises
    ------
    JournalRefused
        Redis refused the write and holds no record of the client: nothing was written.
    Unresolved
        The gateway stops or the job went before the outcome was known.
    """

    def write() -> Awaitable[Accepted]:
        return gw.journal.accept(job.name, rnd, client, record, cap=cap)

    try:
        return await write()
    except ResponseError as exc:  # an answer: this try wrote nothing
        refused: ResponseError | None = exc
    except JOURNAL_ERRORS as exc:
        refused = None
        log.warning(
            "job %s: the journal's answer to %s's update of round %d was lost (%s: %s); "
            "writing it again, which says whether the first write landed",
            job.name,
            client,
            rnd,
            type(exc).__name__,
            exc,
        )
    if refused is None:
        return await _until_answered(gw, job, "accept", write)
    have = await _until_answered(
        gw, job, "accept", lambda: gw.journal.round_record(job.name, rnd, client)
    )
    if have is None:
        log.warning(
            "job %s: Redis refused %s's update of round %d: %s", job.name, client, rnd, refused
        )
        raise JournalRefused(
            f"the journal refused the update's record ({refused})",
            retry_after=RETRY_AFTER_S,
            client_id=client,
            round=rnd,
        )
    return Accepted.OK if have.get("key") == record["key"] else Accepted.DUPLICATE


async def withdraw(gw: Acceptor, job: NamedJob, rnd: int, client: str, key: str) -> None:
    """Take back ``client``'s record of round ``rnd`` if it names object ``key`` (a round that
    closed while the update was uploading), tried again until Redis answers.

    Raises
    ------
    Unresolved
        The gateway stops or the job went before Redis answered.
    """
    await _until_answered(
        gw, job, "unaccept", lambda: gw.journal.unaccept(job.name, rnd, client, key)
    )


async def _until_answered(
    gw: Acceptor, job: NamedJob, op: str, call: Callable[[], Awaitable[T]]
) -> T:
    try:
        return await gw.retry(op, call, lambda: gw.jobs.get(job.name) is job)
    except Abandoned:
        raise Unresolved(
            f"journal {op} of job {job.name}: "
            + ("the gateway stops" if gw.stopping else "the job went")
            + " before Redis answered"
        ) from None

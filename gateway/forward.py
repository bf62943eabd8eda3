"""A finished slot's partial on its way to the job's root node, tried until the root has it or
it is known to be in no model; and the accounting of acknowledged updates that are in none.

The partial was journaled here when its slot finished (``slot_done``) and stays in this node's
store until its round closes here, so a forward can always be tried again, and a gateway
restarted meanwhile sends it again from the journal. :func:`send_partial` posts it to
``/v1/internal/jobs/{job}/rounds/{r}/partials?slot=S`` on the root:

- 2xx: delivered.
- no answer, a 5xx, no address for the root yet, or a 401/403 (the root does not take this
  node's credential: an admin secret or a certificate being rotated, a name missing from the
  root's ``tls_internal_names``; an operator can mend it while the round is open): tried again
  after a wait that doubles from 50 ms up to ``retry_max_s`` (each try counted in
  ``fedfaas_gateway_partial_retries_total`` and logged), for as long as the round is open
  here. There is no last try.
- 409 ``stale_round`` / ``unknown_slot`` or 404 ``unknown_job`` (the root's round or plan
  moved), or the round closed here before an answer came: the journal says what happened
  (:func:`_verdict`): the job was deleted (nothing to do: every node forgets it); another node
  is the root now (followed, and the partial sent there); the root journaled this slot's
  partial for the round (delivered: an earlier answer was lost); the root published the round
  without it (dropped); the root has not opened the round yet (tried again).
- any other refusal (a partial the root can never take, e.g. 400 ``spec_mismatch``): dropped.

A dropped partial is never silent (:func:`drop`): its updates count in
``fedfaas_gateway_updates_dropped_total{reason}``, the job's status lists them with their clients
(``dropped``), and an error is logged. So are the updates of a slot that had not finished when
its round ended here (:func:`drop_unfinished`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx

from gateway.background import FIRST_DELAY_S

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node
    from gateway.plan import Slot
    from gateway.rounds import RoundEngine
    from gateway.slots import Input

log = logging.getLogger(__name__)

__all__ = ["drop", "drop_unfinished", "send_partial"]

#: the root's refusals that mean its round or plan moved: the journal says what happened
MOVED = frozenset({"stale_round", "unknown_slot", "unknown_job"})
#: the root does not take this node's credential (yet): tried again, not dropped
CREDENTIAL_REFUSED = frozenset({401, 403})
#: what the journal says of a partial whose round or plan moved at the root (:func:`_verdict`)
GONE, RETRY, DELIVERED, DROPPED, UNCONFIRMED = (
    "gone",
    "retry",
    "delivered",
    "dropped",
    "unconfirmed",
)


async def send_partial(gw: Node, job: Job, eng: RoundEngine, slot: Slot, inp: Input) -> None:
    """Deliver the partial ``inp`` of ``slot`` (round ``eng.round``) to ``job``'s root node
    (see the module docstring). Returns once it is delivered, known dropped (and counted), or
    no longer this node's to send (the job gone, the gateway stopping, this node the root)."""
    sid, rnd = slot.id, eng.round
    delay = FIRST_DELAY_S
    body: bytes | None = None
    tries = 0
    while (sid, job.root) not in eng.delivered and sid not in eng.dropped:
        if gw.stopping or gw.jobs.get(job.name) is not job:
            return  # the journal keeps it: a restart sends it again; a deleted job needs none
        if job.root == gw.settings.node:
            # this node took the job over and the plan with the top here has not arrived yet:
            # the partial stays here and goes to the top when it does (RoundEngine.apply_plan)
            log.info("job %s: partial of slot %d waits for the top to move here", job.name, sid)
            return
        if eng.closed or body is None and not job.ns.leases(inp.key):
            why = await _settle(gw, job, eng, sid, inp, "its round closed here", final=True)
        else:
            if body is None:
                with job.ns.open(inp.key) as obj:
                    body = bytes(obj.buf)
            why = await _try_once(gw, job, eng, sid, inp, body)
        if why is None:
            return
        tries += 1
        gw.metrics.partial_retries.inc()
        log.warning(
            "job %s round %d: partial of slot %d not delivered to root %s (try %d: %s); "
            "trying again in %.2f s",
            job.name,
            rnd,
            sid,
            job.root,
            tries,
            why,
            delay,
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, gw.settings.retry_max_s)


async def _try_once(
    gw: Node, job: Job, eng: RoundEngine, sid: int, inp: Input, body: bytes
) -> str | None:
    """One post of the partial to the root: None when it is settled, else why not yet."""
    url = gw.peer_url(job.root)
    if url is None:
        if gw.discovery is None:
            # no peers configured and none to discover: a setting is missing, nothing changes
            # it while the gateway runs. Retrying is right still: a takeover moves the root.
            return f"no address configured for root node {job.root} (the peers setting)"
        return f"root node {job.root} not discovered yet"
    try:
        r = await gw.peers.post(
            f"{url}/v1/internal/jobs/{job.name}/rounds/{eng.round}/partials",
            params={"slot": sid},
            content=body,
            headers={"Authorization": f"Bearer {gw.secret}"},
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code < 300:
        eng.delivered.add((sid, job.root))
        return None
    code, detail = _error_of(r)
    if r.status_code >= 500 or r.status_code in CREDENTIAL_REFUSED:
        return f"{r.status_code} {code}: {detail}"
    if code in MOVED:
        return await _settle(gw, job, eng, sid, inp, f"root answered {r.status_code} {code}")
    drop(
        gw,
        job,
        eng,
        sid,
        inp.clients,
        inp.count,
        f"root {job.root} refused the partial: {r.status_code} {code}: {detail}",
        "refused",
    )
    return None


async def _settle(
    gw: Node,
    job: Job,
    eng: RoundEngine,
    sid: int,
    inp: Input,
    cause: str,
    *,
    final: bool = False,
) -> str | None:
    """The round or plan moved (``cause``): what the journal says happened to the partial.
    None when settled; else why it is sent again. ``final``: it cannot be sent again (the
    round closed here), so a root that is behind leaves it unconfirmed."""
    verdict = await _verdict(gw, job, eng.round, sid)
    if verdict == GONE:
        log.info("job %s was deleted: partial of slot %d not sent", job.name, sid)
        eng.dropped.add(sid)  # nothing to count: the job and its rounds are gone
        return None
    if verdict == DELIVERED:
        log.warning(
            "job %s round %d: root %s holds slot %d's partial (%s; an answer was lost)",
            job.name,
            eng.round,
            job.root,
            sid,
            cause,
        )
        eng.delivered.add((sid, job.root))
        return None
    if verdict == RETRY and not final:
        return f"{cause}; root {job.root} has not opened round {eng.round} yet"
    why = (
        f"{cause}, and root {job.root} published round {eng.round} without it"
        if verdict == DROPPED
        else f"{cause}, and whether root {job.root} had it is no longer in the journal"
    )
    drop(
        gw,
        job,
        eng,
        sid,
        inp.clients,
        inp.count,
        why,
        "round_closed" if verdict == DROPPED else verdict,
    )
    return None


async def _verdict(gw: Node, job: Job, rnd: int, sid: int) -> str:
    """What the journal says of slot ``sid``'s partial of round ``rnd``: the job deleted
    (:data:`GONE`), another root or the root behind (:data:`RETRY`), the root holds it
    (:data:`DELIVERED`), the root published the round without it (:data:`DROPPED`), or the
    round's records are gone already (:data:`UNCONFIRMED`)."""

    def still() -> bool:
        return gw.jobs.get(job.name) is job

    meta = await gw.retry("job", lambda: gw.journal.job(job.name), still)
    if meta is None or int(meta["id"]) != job.id:
        return GONE
    if meta["nodes"] != job.nodes:  # another node took the job over: follow it
        if job.root != gw.settings.node:
            gw.move_root(job, list(meta["nodes"]))
        return RETRY
    version = await gw.retry("version", lambda: gw.journal.version(job.name), still)
    if version < rnd:
        return RETRY
    held = await gw.retry(
        "done_slots", lambda: gw.journal.done_slots(job.name, rnd, job.root), still
    )
    if sid in held:
        return DELIVERED
    return DROPPED if version == rnd else UNCONFIRMED


def drop(
    gw: Node,
    job: Job,
    eng: RoundEngine,
    sid: int,
    clients: Sequence[str],
    count: int,
    why: str,
    reason: str,
) -> None:
    """Count, list and log ``count`` acknowledged updates of slot ``sid`` (from ``clients``)
    that no published model holds; once per slot and round."""
    if sid in eng.dropped:
        return
    eng.dropped.add(sid)
    job.note_dropped(eng.round, sid, clients, count, why)
    gw.metrics.dropped_updates.labels(reason=reason).inc(count)
    log.error(
        "job %s round %d: %d acknowledged update(s) of slot %d are in no model (clients %s): %s",
        job.name,
        eng.round,
        count,
        sid,
        ", ".join(clients) or "?",
        why,
    )


def drop_unfinished(gw: Node, job: Job, eng: RoundEngine, why: str) -> None:
    """The round ends here (the root published it) while local slots still hold updates that
    no partial carried on: each such slot's updates are dropped (:func:`drop`)."""
    for sid, clients in eng.unfinished().items():
        drop(gw, job, eng, sid, clients, len(clients), why, "round_ended")


def _error_of(r: httpx.Response) -> tuple[str, str]:
    """``(code, detail)`` of a gateway's error answer (``{"error", "detail"}``), or what there is."""
    try:
        data = r.json()
    except ValueError:
        return "", r.text[:300]
    if isinstance(data, dict):
        return str(data.get("error", "")), str(data.get("detail", ""))[:300]
    return "", r.text[:300]

"""A published round for FLStore: updates kept for the cache functions, and the cache engine told.

On a job's root with a handoff server (``handoff_ttl_s``), each accepted update is checkpointed
to MinIO and kept in this node's store; at publication the round's kept updates are offered to
the node's cache functions and the engine is told the round is complete, with the offer's ticket.
A round is kept whole or not at all: once the node's stores hold past ``LEND_SHARE`` of its
memory budget (:mod:`cache_engine.node_memory`), the round's kept updates are let go and it is
not offered (its updates leave the store once aggregated; FLStore reads them from MinIO).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx

from cache_engine.node_memory import LEND_SHARE, past_budget
from core import wire

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node

log = logging.getLogger(__name__)


def offer_round(gw: Node, job: Job, rnd: int) -> dict[str, Any] | None:
    """Offer round ``rnd``'s updates kept for FLStore to this node's cache functions; the
    offer's ticket goes to the engine with the round's notice. Updates kept for earlier
    rounds (a round that never published here) are let go."""
    kept = job.handoff.pop(rnd, {})
    for r in [r for r in job.handoff if r < rnd]:
        _drop_kept(job, job.handoff.pop(r))
    if gw.handoff is None or not kept:
        return None
    s = gw.settings
    ticket = gw.handoff.offer(
        job.ns, job.name, rnd, job.spec.numel, job.spec.hash.hex(), kept, s.handoff_ttl_s
    )
    return {"socket": str(s.handoff_path()), "ticket": ticket, "node": s.node}


def _drop_kept(job: Job, kept: dict[str, bytes] | None) -> None:
    for k in (kept or {}).values():
        if job.ns.leases(k):
            job.ns.release(k)


def notify_engine(
    gw: Node, job: str, rnd: int, meta_key: str, handoff: dict[str, Any] | None = None
) -> None:
    """Tell the FLStore cache engine that round ``rnd`` is in MinIO, once it is.

    The engine ingests a round from the cold store, so this waits until the writer has
    sent the round's ``meta.json`` (queued last, so the round's other objects from this
    node went first; a MinIO outage delays the notice, never drops it), then retries the
    call with backoff until the engine answers. ``handoff`` (:func:`offer_round`) goes
    with it: where to claim the round's updates in this node's store.
    """
    url = gw.settings.engine_url
    if not url or gw.checkpoints is None:
        return
    target = f"{url.rstrip('/')}/v1/jobs/{job}/rounds/{rnd}/complete"
    headers = gw.engine_headers
    body = {"handoff": handoff} if handoff else None

    async def run() -> None:
        while not gw.stopping:
            if await asyncio.to_thread(gw.checkpoints.wait_sent, meta_key, 5.0):
                break
        delay = 0.5
        while not gw.stopping:
            try:
                r = await gw.peers.post(target, headers=headers, json=body)
                if r.status_code < 500:
                    if r.status_code >= 400:
                        log.warning("cache engine refused round %s/%d: %s", job, rnd, r.text)
                    else:
                        log.info("cache engine told: %s round %d complete", job, rnd)
                    return
            except httpx.HTTPError as exc:
                log.debug("cache engine unreachable (%s); retrying", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    gw.background.spawn(run(), f"engine-notice:{job}/{rnd}")


def checkpoint_client(gw: Node, job: Job, rnd: int, client: str, key: bytes) -> None:
    """Queue an accepted update for MinIO (encoded off the event loop; one extra lease);
    on the root with a handoff, keep it for FLStore too (one more lease, see
    :func:`offer_round`)."""
    if gw.checkpoints is None or not gw.settings.checkpoint_clients:
        return
    if job.secagg is not None:  # a masked vector is no update FLStore could read
        return
    job.ns.retain(key)
    s = gw.settings
    lends = gw.handoff is not None and job.root == s.node
    kept = job.handoff.setdefault(rnd, {}) if lends else None
    if kept is not None:
        if past_budget(s.shm_root, s.node_memory_bytes, 0, LEND_SHARE) is None:
            job.ns.retain(key)
            kept[client] = key
        else:  # the round's uploads come first; a round is lent whole or not at all (the
            # engine takes an offered round's updates as mapped in place, not as loads)
            _drop_kept(job, kept)
            job.handoff[rnd] = None

    async def run() -> None:
        try:

            def encode() -> None:
                with job.ns.open(key) as obj:
                    data = wire.encode(obj.buf, job.spec)
                gw.checkpoints.put_client(job.name, rnd, client, data)

            await asyncio.to_thread(encode)
        except Exception:
            log.exception("job %s: checkpoint of %s's update failed", job.name, client)
        finally:
            job.ns.release(key)

    gw.background.spawn(run(), f"checkpoint:{job.name}/{rnd}/{client}")

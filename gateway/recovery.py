"""A node gateway's jobs from before a restart: the model, the open round, the leftovers.

At start (and at every read of the journal, for jobs new to this node), a job of this node
comes back from the journal and the objects it names in the node's store:

- :func:`recover_model`: on the job's root, the published model (and a server optimizer's
  state, an async job's older models) the journal's publish record names. The round's objects
  and the previous model are freed only after that record is written (:mod:`gateway.publish`),
  so a gateway killed at any point finds them.
- :func:`recover_round`: the open round's plan, its journaled checkpoints and finished
  partials (this node's own records), and its journaled updates (answered 202: each counts
  once); what the journal does not name is swept.
- :func:`sweep_deleted_jobs`: the store folders of jobs this node does not run any more
  (deleted, or finished, while it was down) are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from core import wire
from core.objstore.arena import ARENA_NAME
from gateway.control import resume_plan
from gateway.secagg import served_spec

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node

log = logging.getLogger(__name__)

__all__ = ["recover_model", "recover_round", "sweep_deleted_jobs"]


async def recover_model(gw: Node, job: Job) -> bool:
    """A job of ours from before a restart: adopt its global model from the store."""
    rec = await gw.journal.global_record(job.name)
    key = rec.get("key") if rec else None
    if not key or not job.ns.adopt(key):
        log.error(
            "job %s: global model v%d is not in the store any more; cannot resume it here",
            job.name,
            job.version,
        )
        return False
    opt = {n: bytes.fromhex(k) for n, k in (rec or {}).get("opt", {}).items()}
    if not all(job.ns.adopt(k) for k in opt.values()):
        log.error(
            "job %s: the server optimizer's state of v%d is not in the store any more; "
            "cannot resume it here",
            job.name,
            job.version,
        )
        return False
    history = {int(v): bytes.fromhex(k) for v, k in (rec or {}).get("history", {}).items()}
    if job.open_round is None:  # finished: freed at its last publication
        history = {}
    for v, k in list(history.items()):
        if not job.ns.adopt(k):  # its updates get 409 too_stale: nothing is mixed up
            log.warning("job %s: model v%d is not in the store any more", job.name, v)
            del history[v]
    job.global_key, job.opt_keys, job.history = bytes.fromhex(key), opt, history
    with job.ns.open(key) as obj:
        job.model_bytes = await asyncio.to_thread(
            wire.encode_view,
            obj.buf,
            served_spec(job.spec),
            job.model_metadata(job.version),
            threads=gw.settings.encode_threads,
        )
    log.info("job %s: resumed at version %d", job.name, job.version)
    return True


async def recover_round(gw: Node, job: Job) -> None:
    """Re-queue the open round's journaled updates (202 was sent: they must count once)."""
    eng = job.engine
    if eng is None:
        return
    await resume_plan(gw, job)
    # awaiting the control plane's plan, this node runs a plan of its own whose slot ids
    # name other slots than the journal's: the finished partials are sent again to the
    # pushed plan's parents (RoundEngine.apply_plan on their nodes)
    waits = job.awaiting_plan
    me = gw.settings.node
    done = {} if waits else await gw.journal.done_slots(job.name, eng.round, me)
    saved = {} if waits else await gw.journal.checkpoints(job.name, eng.round, me)
    for sid, rec in saved.items():
        if sid in eng.slots and sid not in done and job.ns.adopt(rec["key"]):
            eng.restore_checkpoint(
                sid,
                bytes.fromhex(rec["key"]),
                float(rec["weight"]),
                int(rec["count"]),
                list(rec["clients"]),
                [int(c) for c in rec["children"]],
            )
    for sid, rec in done.items():
        if sid not in eng.slots:
            continue
        gone = eng.superseded(sid, done)
        if gone or job.ns.adopt(rec["key"]):
            eng.restore_done(
                sid,
                bytes.fromhex(rec["key"]),
                float(rec["weight"]),
                int(rec["count"]),
                list(rec["clients"]),
                superseded=gone,
            )
    recs = await gw.journal.round_updates(job.name, eng.round)
    # a restored checkpoint or partial of a remote child names that node's clients too; only
    # the updates accepted here count in this node's intake (its ``received``, its capacity)
    for client in [c for c in eng.clients if recs.get(c, {}).get("node", me) != me]:
        del eng.clients[client]
    for client, rec in sorted(recs.items(), key=lambda kv: kv[1].get("t", 0)):
        if rec.get("node") != me or client in eng.clients:
            continue
        if not job.ns.adopt(rec["key"]):
            log.error(
                "job %s: journaled update of %s (round %d) is lost; it may upload again",
                job.name,
                client,
                eng.round,
            )
            await gw.journal.unaccept(job.name, eng.round, client, rec["key"])
            continue
        eng.add_update(client, bytes.fromhex(rec["key"]), float(rec["weight"]))
    swept = job.ns.sweep()
    gw.pump(job)
    if recs:
        log.info(
            "job %s: round %d resumed with %d journaled updates (%d stale objects removed)",
            job.name,
            eng.round,
            eng.accepted,
            swept,
        )


def sweep_deleted_jobs(gw: Node) -> None:
    """Remove this node's store folders of jobs it does not run (deleted, or finished
    elsewhere, while this gateway was down: every stop leaves the stores)."""
    here = gw.settings.shm_root / gw.settings.node
    if not here.is_dir():
        return
    for d in here.iterdir():
        if d.name in gw.jobs or not d.is_dir() or not (d / ARENA_NAME).exists():
            continue
        log.warning("store of job %s is left from a job this node no longer has; removed", d.name)
        with contextlib.suppress(OSError):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    for empty in (here, gw.settings.shm_root):  # as a namespace's close leaves them
        with contextlib.suppress(OSError):
            empty.rmdir()

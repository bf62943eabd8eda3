"""The root node publishes a round: the next model, journaled before anything is freed.

The top aggregator's result is the round's FedAvg. :func:`publish_round` makes the next model
from it (a server optimizer's step, an async job's buffer applied: :mod:`gateway.server_opt`,
:mod:`gateway.fedbuff`), encodes it for ``GET model``, and then, in this order:

1. journals the new version (:meth:`gateway.journal.Journal.publish`), tried again until Redis
   takes it (:class:`gateway.background.JournalRetry`: logged, counted in
   ``fedfaas_gateway_journal_retries_total{op="publish"}``);
2. only then frees what the new version supersedes: the round's objects (updates, partials,
   checkpoints), the previous model, an optimizer's previous state, an async job's models no
   update may train on any more;
3. serves the new model, checkpoints it to MinIO (its ``meta.json`` read from the journal
   before step 1), tells the cache engine, opens the next round, with nothing awaited in
   between: no upload sees the new version served and its round not open yet.

So until the journal names the new version, everything the round was made from is still in the
store and still journaled: a gateway killed at any point before (or a Redis that is down for a
while) loses nothing, and a restart runs the round again from the journal
(:func:`gateway.recovery.recover_round`) to the same model. A root that another node took
over meanwhile (:class:`~gateway.journal.NotRoot`) forgets the job and loads it again as one of
its nodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core import wire
from gateway import fedbuff, server_opt, unmask
from gateway.background import Abandoned
from gateway.journal import NotRoot
from gateway.meta import round_meta_doc
from gateway.secagg import served_spec
from gateway.sharded import ShardedRound

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node
    from gateway.rounds import RoundEngine
    from gateway.slots import Input

log = logging.getLogger(__name__)

__all__ = ["global_record", "publish_round"]


async def publish_round(gw: Node, job: Job, eng: RoundEngine, res: Input) -> None:
    """Publish round ``eng.round`` of ``job`` from its top's result ``res`` (see the module
    docstring). Ends quietly (:class:`Abandoned`) when the gateway stops or the job is gone
    before the journal took the new version: nothing was freed, the journal still holds the
    round."""

    def still() -> bool:
        return gw.jobs.get(job.name) is job and job.engine is eng

    rnd = eng.round
    key, opt_keys = res.key, job.opt_keys
    if job.secagg is not None:  # the masked sum: unmasked once the control plane sends shares
        unmasked = await unmask.unmasked_model(gw, job, res, rnd, still)
        if unmasked is None:  # cannot be unmasked: the control plane fails the job
            return
        key = unmasked
    elif job.server_opt is not None:
        key, opt_keys = await asyncio.to_thread(server_opt.step, job, res.key, rnd)
    elif job.fedbuff is not None:
        records = await gw.retry(
            "round_updates", lambda: gw.journal.round_updates(job.name, rnd), still
        )
        key = await asyncio.to_thread(fedbuff.step, job, res.key, res.count, records)
    with job.ns.open(key) as obj:
        data = await asyncio.to_thread(
            wire.encode_view,
            obj.buf,
            served_spec(job.spec),
            job.model_metadata(rnd),
            threads=gw.settings.encode_threads,
            out=job.free_model_buffer(),  # pages already in place: no faults in the tail
        )
    history = dict(job.history)
    dropped: list[bytes] = []
    if job.fedbuff is not None and job.global_key is not None:  # later updates trained on it
        history[job.version] = job.global_key
        oldest = rnd - job.fedbuff.max_staleness
        dropped = [history.pop(v) for v in sorted(history) if v < oldest]
    record = global_record(key, res.weight, res.count, opt_keys, history)
    # read before the write: from the write to the next round's opening nothing awaits, so
    # no upload finds the new version served and the round it opens not open yet
    meta = await round_meta(gw, job, eng, res) if gw.checkpoints is not None else None
    try:
        await gw.retry(
            "publish",
            lambda: gw.journal.publish(job.name, rnd, record, root=gw.settings.node),
            still,
        )
    except NotRoot:
        # another node took the job over while this one was cut off: its model is not the
        # job's; forget the job and load it again as one of its nodes
        log.error(
            "job %s: round %d not published, node %s is not its root any more",
            job.name,
            rnd,
            gw.settings.node,
        )
        gw.forget_and_reload(job)
        return
    except Abandoned:
        log.warning(
            "job %s: round %d not published before %s; the journal still holds the round",
            job.name,
            rnd,
            "the gateway stopped" if gw.stopping else "the job went",
        )
        raise
    # the journal names the new version: only now is what it supersedes freed
    old, old_opt = job.global_key, job.opt_keys
    eng.close(keep=res.key)
    job.keep_model_buffer(data)
    job.global_key, job.model_bytes, job.version = key, data, rnd
    job.opt_keys, job.history = opt_keys, history
    superseded = list(dropped)
    if job.fedbuff is None and old is not None:
        superseded.append(old)
    if key != res.key:  # a step made the model from the round's FedAvg: that is done with
        superseded += [res.key, *old_opt.values()]
    for k in superseded:
        if job.ns.leases(k):
            job.ns.free(k)
    if job.times:
        job.times[-1].published_ns = time.monotonic_ns()
        job.times[-1].count = res.count
    gw.metrics.rounds.inc()
    if gw.checkpoints is not None and meta is not None:
        gw.checkpoints.put_global(job.name, rnd, data, {"version": rnd, "count": res.count})
        if job.server_opt is not None:
            gw.checkpoints.put_server_opt(job.name, rnd, server_opt.state_bytes(job, opt_keys, rnd))
        meta_key = gw.checkpoints.put_meta(job.name, rnd, meta)
        gw.notify_engine(job.name, rnd, meta_key, gw.offer_round(job, rnd))
    log.info(
        "job %s: round %d published (version %d, %d updates, weight %.0f)",
        job.name,
        rnd,
        job.version,
        res.count,
        res.weight,
    )
    gw.open_round(job)


async def round_meta(gw: Node, job: Job, eng: RoundEngine, res: Input) -> dict[str, Any]:
    """Round ``eng.round``'s ``meta.json`` (see :func:`round_meta_doc`), from the journal (its
    reads tried again until Redis answers)."""
    rnd = eng.round

    def still() -> bool:
        return gw.jobs.get(job.name) is job

    records = await gw.retry(
        "round_updates", lambda: gw.journal.round_updates(job.name, rnd), still
    )
    meta = await gw.retry("job", lambda: gw.journal.job(job.name), still)
    evaluator = (meta or {}).get("evaluator")
    doc = round_meta_doc(job.name, rnd, rnd, res.count, res.weight, records, evaluator)
    if isinstance(eng, ShardedRound):
        doc["aggregation"] = eng.decision
    if eng.plan.excluded:
        doc["excluded"] = eng.plan.excluded  # dropped before aggregation, and why
    return doc


def global_record(
    key: bytes,
    weight: float,
    count: int,
    opt_keys: Mapping[str, bytes],
    history: Mapping[int, bytes] | None = None,
) -> dict[str, Any]:
    """The journal's record of a published model: its object, the server optimizer's state
    objects when the job has one (:mod:`gateway.server_opt`), and an async job's older models
    its next updates may have trained on (:mod:`gateway.fedbuff`)."""
    rec: dict[str, Any] = {"key": key.hex(), "weight": weight, "count": count}
    if opt_keys:
        rec["opt"] = {n: k.hex() for n, k in opt_keys.items()}
    if history:
        rec["history"] = {str(v): k.hex() for v, k in history.items()}
    return rec

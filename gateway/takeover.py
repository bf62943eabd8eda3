"""A node takes a job over from its dead root node (``POST /v1/jobs/{job}/adopt``).

The root node publishes the job's models and runs its top aggregator. When it dies for good
(its gateway gone with its shared memory), the control plane asks another node of the job to
adopt it. That node:

1. takes the global model of the journal's version from what it holds (a non-root node
   fetches each new model from the root as soon as it is published, for its own clients)
   or else from the job's last checkpoint in MinIO; neither: 409 ``model_lost``;
2. writes it into its own store and becomes the root in the journal, with a compare-and-set
   on the old root and the version (:meth:`gateway.journal.Journal.take_root`), which also
   fences the old root's publications;
   With a server optimizer, its state after that version comes from MinIO (the root
   checkpoints it beside each model: :mod:`gateway.server_opt`); missing: 409 ``model_lost``;
3. forgets the journal records of the open round's updates that the dead node had accepted:
   they were never aggregated and are gone with its memory. The answer lists those clients;
   the control plane tells them to upload again (their ``resend`` count in the assignment),
   and ``HSETNX`` lets each count once.

The open round goes on: the control plane pushes a plan with the top on this node, and every
finished partial whose parent moved is sent again to it (:meth:`RoundEngine.apply_plan`), so
the survivors' work is neither lost nor counted twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from core import wire
from gateway import server_opt
from gateway.errors import GatewayError
from gateway.journal import NotRoot

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node

log = logging.getLogger(__name__)


class ModelLost(GatewayError):
    """Neither this node nor MinIO holds the job's published model (409 ``model_lost``)."""

    status = 409
    code = "model_lost"


async def adopt(gw: Node, job: Job, dead: str) -> dict[str, Any]:
    """Become ``job``'s root in place of node ``dead`` (see the module docstring).

    Raises
    ------
    GatewayError
        409 ``not_root``: ``dead`` is not the job's root (any more), or this node is.
    ModelLost
        409: the model of the journal's version is neither here nor in MinIO.
    """
    me = gw.settings.node
    if job.root == me:
        raise GatewayError(
            f"node {me} is the root of job {job.name!r} already", status=409, code="not_root"
        )
    meta = await gw.journal.job(job.name)
    if meta is None or meta["nodes"][0] != dead:  # before any model is read: a cheap refusal
        raise GatewayError(
            f"node {dead} is not the root of job {job.name!r}", status=409, code="not_root"
        )
    version = await gw.journal.version(job.name)
    data = await _model_of_version(gw, job, version)
    g = job.ns.allocate()
    try:
        wire.decode_into(data, job.spec, g.buf, gw.settings.max_header, check_finite=True)
        wire.write_header(g.buf, job.spec, kind=wire.KIND_GLOBAL, weight=0, count=0, round=version)
    except wire.WireError as exc:
        g.close()
        job.ns.free(g.key)
        raise ModelLost(f"the model of version {version} does not decode: {exc.detail}") from None
    g.close()
    job.ns.seal(g.key)
    try:
        opt_keys = await _server_opt_state(gw, job, version)
    except GatewayError:
        job.ns.free(g.key)
        raise
    rec: dict[str, Any] = {"key": g.key, "weight": 0, "count": 0}
    if opt_keys:
        rec["opt"] = {n: k.hex() for n, k in opt_keys.items()}
    try:
        # an async job's older models died with the old root: updates trained on them are
        # refused from now on (too_stale), on every node (the job's metadata says so)
        since = version if job.fedbuff is not None else None
        meta = await gw.journal.take_root(job.name, dead, me, version, rec, since=since)
    except NotRoot as exc:
        for k in [g.key_bytes, *opt_keys.values()]:
            job.ns.free(k)
        raise GatewayError(str(exc), status=409, code="not_root") from None
    gw.move_root(job, list(meta["nodes"]))
    if job.version != version:
        gw.advance_remote(job, version)
    old = job.global_key
    job.global_key, job.model_bytes, job.opt_keys = g.key_bytes, data, opt_keys
    job.since, job.history = int(meta.get("since", 0)), {}
    if old is not None and old != g.key_bytes and job.ns.leases(old):
        job.ns.free(old)
    job.reserve_model_buffers()
    rnd = job.open_round
    resend = [] if rnd is None else await gw.journal.forget_updates(job.name, rnd, dead)
    log.warning(
        "job %s: node %s took it over from dead root %s at version %d; round %s: %d update(s) "
        "accepted there are gone with its memory and must be sent again",
        job.name,
        me,
        dead,
        version,
        rnd,
        len(resend),
    )
    return {"job": job.name, "root": me, "version": version, "round": rnd, "resend": resend}


async def _server_opt_state(gw: Node, job: Job, version: int) -> dict[str, bytes]:
    """The job's server optimizer state after ``version``, read from MinIO into this node's
    store (its keys; none for a job without an optimizer, or before its first round)."""
    if job.server_opt is None or version == 0 or not job.server_opt.state_names:
        return {}
    data = await gw.server_opt_checkpoint(job.name, version) if gw.checkpoints else None
    if data is None:
        raise ModelLost(
            f"job {job.name!r}: the state of its server optimizer ({job.server_opt.name}) after "
            f"version {version} is not in MinIO"
            + ("" if gw.checkpoints else " (the gateway has no MinIO: --minio)")
        )
    return server_opt.write_state(job, server_opt.from_checkpoint(data, job, version), version)


async def _model_of_version(gw: Node, job: Job, version: int) -> bytes:
    """The safetensors of model ``version``: the copy this node fetched, else MinIO's."""
    if job.version == version and job.model_bytes:
        return bytes(job.model_bytes)
    if gw.checkpoints is not None:
        found = await gw.newest_checkpoint(job.name)
        if found is not None and found[0] == version:
            return bytes(found[1])
        have = "none" if found is None else f"round {found[0]}"
        raise ModelLost(
            f"job {job.name!r}: model version {version} was not fetched here and MinIO's last "
            f"checkpoint is {have}"
        )
    raise ModelLost(
        f"job {job.name!r}: model version {version} was not fetched here and the gateway has "
        "no MinIO (--minio) to read a checkpoint from"
    )

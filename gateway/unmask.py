"""The root gateway unmasks a secure-aggregation round (:mod:`core.secagg`) and publishes it.

The top's result of a masked job is the Z_2^32 sum of the masked vectors the round folded.
:func:`unmasked_model` (called by :func:`gateway.publish.publish_round` before it publishes)
holds that round: it reads from the journal which clients' vectors the sum holds (the round's
accepted updates; a sum whose count differs fails the round, since nobody could say whose
masks to remove), offers them at ``GET /v1/jobs/{job}/rounds/{r}/unmask`` and waits for the
control plane's ``POST`` of the same route: every advert of the round, who shared keys, and the
survivors' unmask shares (:mod:`core.secagg.messages`). It rebuilds the dropped clients' key
seeds and the survivors' self seeds from the shares (:meth:`Coordinator.restore`, then
:meth:`Coordinator.unmask`), removes their masks from a copy of the sum, dequantizes, and
writes the weighted FedAvg into a new object (float32 bits in the first words of the job's
uint32 layout, the weight word 0): that object is the round's model, served as one float32
tensor (:func:`gateway.secagg.served_spec`). A round that cannot be unmasked (too few
vectors or shares, a wrong share) is not published: the ``POST`` answers 409
``unmask_failed`` saying why, and the control plane fails the job with that message.

Both routes are the admin's (the control plane's): a client never talks to this stage here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import FastAPI, Request

from core import wire
from core.secagg.coordinator import Coordinator, RoundFailed
from core.secagg.messages import (
    Advert,
    MessageError,
    Shares,
    context,
    unmask_from_json,
)
from gateway import auth
from gateway.background import Abandoned
from gateway.errors import GatewayError, Unauthorized

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node
    from gateway.slots import Input

log = logging.getLogger(__name__)

CODE = "bad_unmask"
#: the most clients one unmask body may name (adverts, shared, shares)
MAX_CLIENTS = 100_000


@dataclass
class Material:
    """What the control plane sends for one round's unmasking."""

    adverts: dict[str, Advert]
    shared: list[str]
    shares: dict[str, tuple[Shares, Shares]]


@dataclass
class Waiting:
    """A round of a masked job whose masked sum waits on the root for its shares."""

    round: int
    masked: list[str]
    material: asyncio.Future[Material] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    #: None once published; the reason when the round cannot be unmasked
    outcome: asyncio.Future[str | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


async def unmasked_model(
    gw: Node, job: Job, res: Input, rnd: int, still: Callable[[], bool]
) -> bytes | None:
    """The key of round ``rnd``'s unmasked FedAvg, made from the masked sum ``res`` once the
    control plane sent the shares; None when the round cannot be unmasked (the reason is the
    ``POST``'s answer and the job's ``unmask_failed``)."""
    masked_job = job.secagg
    assert masked_job is not None
    records = await gw.retry(
        "round_updates", lambda: gw.journal.round_updates(job.name, rnd), still
    )
    wait = Waiting(rnd, sorted(records))
    masked_job.waiting[rnd] = wait
    if len(records) != res.count:
        why = (
            f"round {rnd}: the masked sum holds {res.count} vectors but {len(records)} updates "
            "were accepted: whose masks to remove is unknown"
        )
        _failed(job, wait, why)
        return None
    log.info("job %s: round %d waits for its unmask shares (%d vectors)", job.name, rnd, res.count)
    while not wait.material.done():
        if not still():
            if not wait.outcome.done():  # a POST that waits for it hears why
                wait.outcome.set_result(f"round {rnd}: the job went or the gateway stopped")
            raise Abandoned
        await asyncio.wait({wait.material}, timeout=1.0)
    material = wait.material.result()
    try:
        key = await asyncio.to_thread(_unmask, job, res.key, rnd, wait.masked, material)
    except (RoundFailed, MessageError) as exc:
        _failed(job, wait, f"round {rnd}: {exc}")
        return None
    except Exception as exc:  # the store, say: the POST must not wait for ever
        _failed(job, wait, f"round {rnd}: unmasking failed: {exc!r}")
        raise
    wait.outcome.set_result(None)
    return key


def _failed(job: Job, wait: Waiting, why: str) -> None:
    log.error("job %s: %s", job.name, why)
    assert job.secagg is not None
    job.secagg.failed[wait.round] = why
    if not wait.outcome.done():
        wait.outcome.set_result(why)


def _unmask(job: Job, sum_key: bytes, rnd: int, masked: list[str], material: Material) -> bytes:
    """The new model object's key (blocking: run off the event loop)."""
    assert job.secagg is not None
    coord = Coordinator.restore(
        job.secagg.cfg, context(job.name, rnd), material.adverts, material.shared, masked
    )
    for client, (s, b) in sorted(material.shares.items()):
        coord.add_unmask(client, s, b)
    with job.ns.open(sum_key) as obj:
        numel = job.spec.numel
        total = np.frombuffer(obj.buf, np.uint32, count=numel, offset=wire.HEADER_SIZE).copy()
        header = bytes(obj.buf[: wire.HEADER_SIZE])  # the round's weight and count
    fedavg = coord.unmask(total)
    g = job.ns.allocate()
    try:
        g.buf[: wire.HEADER_SIZE] = header
        out = np.frombuffer(g.buf, np.uint32, count=numel, offset=wire.HEADER_SIZE)
        out[:-1] = fedavg.view(np.uint32)
        out[-1] = 0
    finally:
        g.close()
    job.ns.seal(g.key)
    return g.key_bytes


def parse_material(body: Any, masked: list[str]) -> Material:
    """The ``POST``'s body: ``{"adverts": {client: advert}, "shared": [client, ...],
    "shares": {client: {"s": ..., "b": ...}}}``; a :class:`GatewayError` (422) saying what is
    wrong."""
    if not isinstance(body, dict) or set(body) != {"adverts", "shared", "shares"}:
        raise GatewayError(
            'body must be {"adverts": {...}, "shared": [...], "shares": {...}}',
            status=422,
            code=CODE,
        )
    adverts, shared, shares = body["adverts"], body["shared"], body["shares"]
    if not isinstance(adverts, dict) or len(adverts) > MAX_CLIENTS:
        raise GatewayError(
            f"adverts must be an object of at most {MAX_CLIENTS} clients", status=422, code=CODE
        )
    if not isinstance(shared, list) or not all(isinstance(c, str) for c in shared):
        raise GatewayError("shared must be a list of client ids", status=422, code=CODE)
    if not isinstance(shares, dict) or len(shares) > MAX_CLIENTS:
        raise GatewayError(
            f"shares must be an object of at most {MAX_CLIENTS} clients", status=422, code=CODE
        )
    stray = sorted(set(shares) - set(masked))
    if stray:
        raise GatewayError(
            f"shares from clients whose vectors the sum does not hold: {', '.join(stray[:5])}",
            status=422,
            code=CODE,
        )
    try:
        return Material(
            {str(c): Advert.from_json(a) for c, a in adverts.items()},
            list(shared),
            {str(c): unmask_from_json(m, len(adverts)) for c, m in shares.items()},
        )
    except MessageError as exc:
        raise GatewayError(str(exc), status=422, code=CODE) from None


def _waiting(request: Request, name: str, number: int) -> tuple[Job, Waiting | None]:
    gw = request.app.state.gateway
    if not auth.check_admin(gw.secret, request.headers.get("authorization")):
        raise Unauthorized("this route needs the admin bearer token (the gateways' admin secret)")
    job = gw.job(name)
    if job.secagg is None:
        raise GatewayError(
            f"job {name!r} has no secure aggregation: nothing to unmask",
            status=409,
            code="not_masked",
        )
    if job.root != gw.settings.node:
        raise GatewayError(
            f"job {name!r} is unmasked on its root node {job.root}, not here",
            status=409,
            code="not_root",
        )
    return job, job.secagg.waiting.get(number)


def add_routes(app: FastAPI) -> None:
    """``GET`` and ``POST /v1/jobs/{job}/rounds/{number}/unmask`` on the gateway's ``app``."""
    app.add_api_route("/v1/jobs/{job}/rounds/{number}/unmask", unmask_state, methods=["GET"])
    app.add_api_route("/v1/jobs/{job}/rounds/{number}/unmask", unmask_round, methods=["POST"])


async def unmask_state(request: Request, job: str, number: int) -> dict[str, Any]:
    """``{"round", "state", "masked"}``: ``state`` is ``folding`` (no masked sum yet; ``masked``
    empty), ``waiting`` (the sum holds the vectors of ``masked``; send the shares),
    ``published`` or ``failed`` (with ``failed``: why)."""
    j, wait = _waiting(request, job, number)
    assert j.secagg is not None
    out: dict[str, Any] = {"job": job, "round": number, "state": "folding", "masked": []}
    if number <= j.version:
        out["state"] = "published"
    elif wait is not None:
        out["masked"] = wait.masked
        out["state"] = "waiting" if not wait.outcome.done() else "failed"
    if number in j.secagg.failed:
        out["state"], out["failed"] = "failed", j.secagg.failed[number]
    return out


async def unmask_round(request: Request, job: str, number: int) -> dict[str, Any]:
    """Take round ``number``'s shares (see :func:`parse_material`) and answer once it is
    published (200) or cannot be (409 ``unmask_failed``)."""
    j, wait = _waiting(request, job, number)  # the admin check comes before the body
    if wait is None or wait.material.done():
        state = "published" if number <= j.version else "not waiting for shares"
        raise GatewayError(
            f"round {number} of job {job!r} is {state}", status=409, code="round_not_unmasking"
        )
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):
        raise GatewayError("body must be JSON", status=400, code="bad_json") from None
    material = parse_material(body, wait.masked)
    if not wait.material.done():
        wait.material.set_result(material)
    why = await asyncio.shield(wait.outcome)
    if why is not None:
        raise GatewayError(why, status=409, code="unmask_failed")
    return {"job": job, "round": number, "published": True, "count": len(wait.masked)}

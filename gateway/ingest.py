"""Native exchanges: client updates and cross-node partials, received straight into the store."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING

from cache_engine.node_memory import past_budget
from core import wire
from core.objstore import MappedObject, StoreFull
from gateway import auth
from gateway.acceptance import Unresolved
from gateway.bodies import RETRY_AFTER_S, Hold
from gateway.errors import JobNotFound, StoreUnavailable, Unauthorized, UpdateRejected
from gateway.http import Deferred, Exchange, Request, Response
from gateway.meta import parse_client_meta

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node
    from gateway.rounds import RoundEngine

log = logging.getLogger(__name__)

UPLOAD = re.compile(r"^/v1/jobs/([a-z0-9][a-z0-9-]{0,39})/rounds/(\d{1,9})/updates$")
PARTIAL = re.compile(r"^/v1/internal/jobs/([a-z0-9][a-z0-9-]{0,39})/rounds/(\d{1,9})/partials$")


def allocate(
    gw: Node,
    job: Job,
    hold: Hold,
    what: str,
    *,
    client: str | None = None,
    rnd: int | None = None,
) -> MappedObject:
    """A new object in ``job``'s store for ``what``, or :class:`StoreUnavailable` (``hold``,
    the request's share of the memory budget, is then given back, and the refusal counted in
    ``fedfaas_gateway_updates_rejected{code="store_full"}``). Refused too where a new buffer
    would take the node's stores past its memory budget (:func:`past_node_budget`)."""
    try:
        why = past_node_budget(gw, job)
        if why is None:
            return job.ns.allocate()
    except StoreFull as exc:
        why = str(exc)
    except OSError as exc:
        log.warning("job %s: no store object for %s: %s", job.name, what, exc)
        why = f"the object store could not allocate: {exc}"
    hold.release()
    gw.metrics.rejected.labels(StoreUnavailable.code).inc()
    raise StoreUnavailable(
        f"{what}: {why}", retry_after=RETRY_AFTER_S, client_id=client, round=rnd
    ) from None


def past_node_budget(gw: Node, job: Job) -> str | None:
    """Why one more of ``job``'s objects would take the stores under the node's ``shm_root``
    past its memory budget (``node_memory_bytes``, :mod:`cache_engine.node_memory`); None
    where it fits, or where a buffer kept for reuse takes it (no new memory)."""
    if job.ns.stats()["pooled"]:
        return None
    s = gw.settings
    return past_budget(s.shm_root, s.node_memory_bytes, job.spec.object_nbytes)


def _wire_reject(exc: wire.WireError, client: str | None, rnd: int) -> UpdateRejected:
    status = {"header_too_large": 413, "non_finite": 422}.get(exc.code, 400)
    return UpdateRejected(exc.detail, status=status, code=exc.code, client_id=client, round=rnd)


class UploadExchange(Exchange):
    """``POST /v1/jobs/{job}/rounds/{round}/updates``: validate, stream, seal, journal, route."""

    def __init__(self, gw: Node, req: Request, job_name: str, rnd: int) -> None:
        self.gw, self.req, self.job_name, self.rnd = gw, req, job_name, rnd
        self.job: Job | None = None
        self.client = req.header("x-client-id") or ""
        self.weight = 0
        self.meta: dict[str, float | int] | None = None
        self.obj: MappedObject | None = None
        self.dec: wire.UpdateDecoder | None = None
        self.reserved = False
        self.hold: Hold | None = None  # its store object, in the node's memory budget
        self.t0 = time.monotonic_ns()

    def _reject(self, detail: str, status: int, code: str) -> UpdateRejected:
        return UpdateRejected(
            detail, status=status, code=code, client_id=self.client, round=self.rnd
        )

    def start(self) -> None:
        gw, req = self.gw, self.req
        job = gw.jobs.get(self.job_name)
        if job is None:  # which jobs exist is for credential holders only (the admin: 404)
            if not auth.check_admin(gw.secret, req.header("authorization")):
                raise Unauthorized(
                    f"missing or wrong bearer token for client {self.client!r} of job "
                    f"{self.job_name!r} on node {gw.settings.node}"
                )
            raise JobNotFound(
                f"no job {self.job_name!r} on node {gw.settings.node}: create it with POST /v1/jobs"
            )
        if not self.client:
            raise Unauthorized("missing X-Client-Id header")
        job.check_client(self.client, req.header("authorization"))  # 401, or 403 if revoked
        raw = req.header("x-sample-count") or ""
        if not raw.isdigit() or int(raw) <= 0 or len(raw) > 12:
            raise self._reject(
                f"X-Sample-Count must be a positive integer, got {raw[:20]!r}",
                400,
                "bad_sample_count",
            )
        self.weight = int(raw)
        raw_meta = req.header("x-client-meta")
        if raw_meta is not None:
            try:
                self.meta = parse_client_meta(raw_meta)
            except ValueError as exc:
                raise self._reject(f"X-Client-Meta {exc}", 400, "bad_client_meta") from None
        if req.content_length is None:
            raise self._reject(
                "Content-Length is required (the body is streamed into shared memory)",
                411,
                "length_required",
            )
        bound = job.spec.max_upload_bytes(gw.settings.max_header)
        if req.content_length > bound:
            raise self._reject(
                f"Content-Length {req.content_length} exceeds {bound}, the largest valid "
                f"safetensors body for this job's model",
                413,
                "body_too_large",
            )
        job.check_round(self.rnd, self.client, gw.settings.node)
        limit = gw.settings.max_inflight
        if limit and len(job.inflight) >= limit:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            job.admission.append(fut)
            raise Deferred(fut)
        # the node's budget first (503 + Retry-After past it): nothing is allocated before
        hold = gw.budget.reserve(
            job.spec.object_nbytes, f"an update of job {job.name} (client {self.client})"
        )
        self.obj = allocate(
            gw, job, hold, f"an update of client {self.client}", client=self.client, rnd=self.rnd
        )
        job.inflight.add(self.client)
        self.reserved, self.hold = True, hold
        self.job = job
        job.note_first_byte(self.t0)
        self.dec = wire.UpdateDecoder(
            job.spec,
            self.obj.buf,
            req.content_length,
            gw.settings.max_header,
            check_finite=gw.settings.check_finite,
        )

    def get_buffer(self) -> memoryview:
        assert self.dec is not None
        try:
            return self.dec.get_buffer()
        except wire.WireError as exc:
            raise _wire_reject(exc, self.client, self.rnd) from None

    def buffer_updated(self, n: int) -> None:
        assert self.dec is not None
        try:
            self.dec.buffer_updated(n)
        except wire.WireError as exc:
            raise _wire_reject(exc, self.client, self.rnd) from None

    async def complete(self) -> Response:
        job, obj, dec = self.job, self.obj, self.dec
        assert job is not None and obj is not None and dec is not None
        try:
            dec.finish(check_finite=self.gw.settings.check_finite)
        except wire.WireError as exc:
            raise _wire_reject(exc, self.client, self.rnd) from None
        # the round it counts in and its weight: an async job's open buffer and the update's
        # staleness weight (gateway.fedbuff), else the round and its sample count
        rnd, weight = job.buffer_of(self.rnd, self.weight)
        wire.write_header(
            obj.buf, job.spec, kind=wire.KIND_UPDATE, weight=weight, count=1, round=rnd
        )
        self.dec = None
        del dec
        obj.close()
        job.ns.seal(obj.key)
        key = obj.key_bytes
        # journals (with the client's metadata), routes
        try:
            await job.accept(
                self.gw,
                rnd,
                self.client,
                key,
                weight,
                self.meta,
                samples=self.weight,
                base=self.rnd - 1,
            )
        except Unresolved as exc:
            # a record may name it: the object stays in the store, where the journal decides
            # (the job's end frees it; a restart adopts it if its record is there, else sweeps)
            self.obj = None
            raise UpdateRejected(
                f"{exc}; whether the update counts is not known yet: send it again once the "
                "gateway answers (409 duplicate_client then means it counts)",
                status=503,
                code="journal_unavailable",
                client_id=self.client,
                round=rnd,
            ) from None
        self.obj = None  # owned by the round now
        self.gw.checkpoint_client(job, rnd, self.client, key)
        self._unreserve()
        self.gw.metrics.updates.inc()
        self.gw.metrics.ingest_bytes.inc(self.req.content_length or 0)
        self.gw.metrics.ingest_seconds.observe((time.monotonic_ns() - self.t0) / 1e9)
        return Response.json(202, {"key": key.hex(), "round": rnd, "client": self.client})

    def _unreserve(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.release()
        if self.reserved and self.job is not None:
            self.job.inflight.discard(self.client)
            self.reserved = False
            # wake every waiter: each calls start() again and re-defers if still over the limit
            while self.job.admission:
                fut = self.job.admission.popleft()
                if not fut.done():
                    fut.set_result(None)

    def abort(self) -> None:
        self.dec = None
        obj, self.obj = self.obj, None
        if obj is not None and self.job is not None:
            obj.close()
            self.job.ns.free(obj.key)
        self._unreserve()


def _check_remote_child(engine: RoundEngine, slot: int) -> None:
    """409 ``unknown_slot`` unless ``slot`` is a child on another node in the round's plan
    here (the sender's plan and this node's differ: a new one is on its way to one of them)."""
    st = engine.slots.get(slot)
    if st is None or st.local:
        raise UpdateRejected(
            f"slot {slot} is not a slot of another node in round {engine.round}'s plan here "
            f"(plan version {engine.plan_version}); send it again once the plans agree",
            status=409,
            code="unknown_slot",
        )


class PartialExchange(Exchange):
    """``POST /v1/internal/jobs/{job}/rounds/{r}/partials?slot=S``: a partial from another node.

    The body is the raw store object (header + float32 data), received in one copy.
    Authenticated with the admin secret shared by the node gateways.
    """

    def __init__(self, gw: Node, req: Request, job_name: str, rnd: int) -> None:
        self.gw, self.req, self.job_name, self.rnd = gw, req, job_name, rnd
        self.obj: MappedObject | None = None
        self.fill = 0
        self.job: Job | None = None
        self.slot = 0
        self.hold: Hold | None = None

    def _release(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.release()

    def start(self) -> None:
        if not auth.check_admin(self.gw.secret, self.req.header("authorization")):
            raise Unauthorized("internal routes need the admin bearer token")
        job = self.gw.jobs.get(self.job_name)
        if job is None:
            raise JobNotFound(f"no job {self.job_name!r} here")
        from urllib.parse import parse_qs

        q = parse_qs(self.req.query)
        try:
            self.slot = int(q["slot"][0])
        except (KeyError, ValueError):
            raise UpdateRejected("query parameter slot=<child slot id> is required") from None
        if self.req.content_length != job.spec.object_nbytes:
            raise UpdateRejected(
                f"a partial is exactly {job.spec.object_nbytes} bytes",
                status=400,
                code="size_mismatch",
            )
        if job.engine is None or job.engine.round != self.rnd:
            raise UpdateRejected(
                f"round {self.rnd} is not open here", status=409, code="stale_round"
            )
        _check_remote_child(job.engine, self.slot)
        self.job = job
        self.hold = self.gw.budget.reserve(
            job.spec.object_nbytes, f"a partial of job {job.name} (round {self.rnd})"
        )
        self.obj = allocate(self.gw, job, self.hold, f"a partial of round {self.rnd}")

    def get_buffer(self) -> memoryview:
        assert self.obj is not None
        return self.obj.buf[self.fill :]

    def buffer_updated(self, n: int) -> None:
        self.fill += n

    async def complete(self) -> Response:
        job, obj = self.job, self.obj
        assert job is not None and obj is not None
        try:
            h = wire.read_header(obj.buf)
        except wire.WireError as exc:
            raise UpdateRejected(exc.detail, code=exc.code) from None
        if h.spec_hash != job.spec.hash or h.kind != wire.KIND_PARTIAL or h.round != self.rnd:
            raise UpdateRejected(
                "partial does not match this job's spec, kind or round", code="spec_mismatch"
            )
        obj.close()
        job.ns.seal(obj.key)
        key = obj.key_bytes
        self.obj = None
        engine = job.engine
        if engine is None or engine.round != self.rnd:
            job.ns.free(key)
            raise UpdateRejected(
                f"round {self.rnd} closed meanwhile", status=409, code="stale_round"
            )
        self._release()
        try:
            _check_remote_child(engine, self.slot)  # a plan may have arrived meanwhile
        except UpdateRejected:
            job.ns.free(key)
            raise
        engine.add_remote_partial(self.slot, key, h.weight, h.count)
        self.gw.pump(job)
        return Response.json(202, {"key": key.hex(), "round": self.rnd, "slot": self.slot})

    def abort(self) -> None:
        obj, self.obj = self.obj, None
        if obj is not None and self.job is not None:
            obj.close()
            self.job.ns.free(obj.key)
        self._release()

"""HTTP API of the coordinator (FastAPI). Errors answer ``{"error", "detail"}`` with a 4xx/5xx.

Routes:

* ``GET  /healthz``
* ``GET  /v1/nodes``: node health and capacity (with ``gateways_service``, the nodes found so
  far: see :mod:`core.discovery`)
* ``POST /v1/jobs``: create a job (JSON :class:`JobIn`); the answer carries the job's
  ``enrollment_token`` and the token of each client enrolled at creation (``tokens``). Round 1
  opens once ``goal`` clients are enrolled
* ``POST /v1/jobs/{job}/clients``: enroll clients (``{"clients": [...]}``, the enrollment token
  or the admin's); the answer carries their tokens
* ``GET  /v1/jobs/{job}``, ``DELETE /v1/jobs/{job}``
* ``DELETE /v1/jobs/{job}/clients/{id}[?force=true]``: the admin revokes one client, or the
  client leaves (its own token, ``?client=`` its id); forwarded to the job's gateways (see
  :meth:`Coordinator.revoke_client`)
* ``POST /v1/jobs/{job}/rounds``: open the next round (when ``auto_rounds`` is off)
* ``POST /v1/jobs/{job}/rounds/{r}/close``: close the open round now
* ``GET  /v1/jobs/{job}/assignment?client=ID``: ``{job, round, client, node, gateway_url,
  tls_name, resend}`` (``resend`` grows when the client's accepted update was lost with a dead
  root node: it sends the update again, to ``gateway_url``); once the job is done, the job's
  root node, which holds the final model (``done``: true). ``tls_name``: the name the
  gateway's certificate is verified against, where not the URL's host (a node found through
  discovery over TLS: its own name, :mod:`core.server_names`), else null; ``GET /v1/nodes`` gives it too
* ``POST /v1/jobs/{job}/rounds/{r}/failures?client=ID``: the client leaves the open round
  without an update, its training having failed (:mod:`control_plane.client_rounds`)
* ``GET  /v1/jobs/{job}/plan``: the hierarchy of the open round and its clients' nodes
* ``GET  /metrics``: Prometheus text (:func:`metrics_text`): per job its completed rounds and,
  for a DP-FedAvg job, the epsilon spent and its budget; the autoscale decisions that failed
  (admin or analyst bearer)

Every route but ``/healthz`` needs a bearer token (:mod:`core.auth`): admin (the gateways'
admin secret, ``admin_token_file``) for writes; admin or analyst for reads; a job's client (its
token, with ``?client=ID``) for its assignment, its job's round and leaving; the job's
enrollment token for enrolling. A client token is checked
with the job's salt (drawn by its root gateway at creation), so the tokens of an earlier job of
the same name are refused; a revoked client's assignment answers 403 ``client_revoked``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, Field

from control_plane import client_rounds, secagg_stages
from control_plane.coordinator import Coordinator
from control_plane.errors import ControlPlaneError, InvalidInput, RoundStateError
from control_plane.gateways import plan_to_slots
from control_plane.jobs import JobSpec, round_view
from control_plane.selection import OortScheduler
from control_plane.settings import ControlPlaneSettings
from control_plane.store import MemoryStore, RedisStore, StateStore
from core.auth import (
    AuthConfigError,
    Authenticator,
    AuthError,
    Scope,
    install,
    private_app,
    read_token_file,
    require,
)
from core.discovery import Discovery
from core.openfaas import AsyncOpenFaaS, OpenFaaSError, read_basic_auth

log = logging.getLogger(__name__)

NAME = r"^[a-z0-9][a-z0-9-]{0,39}$"


class JobIn(BaseModel):
    """Body of ``POST /v1/jobs``. ``clients`` (optional) enrolls clients at creation: a list
    of ids or a count (ids c0..c{n-1}); others enroll later (``POST /v1/jobs/{job}/clients``)."""

    job: str = Field(pattern=NAME)
    rounds: int = Field(ge=1, le=1_000_000)
    goal: int = Field(ge=1, le=1_000_000)
    clients: list[str] | int = Field(default_factory=list)
    overprovision: float = Field(1.3, ge=1.0, le=10.0)
    deadline_s: float = Field(600.0, gt=0, le=86400)
    policy: str = "bestfit"
    per_leaf: int = Field(2, ge=1, le=1000)
    size: float = Field(1.0, gt=0)
    min_updates: int = Field(
        1, ge=1, description="a round closes at its deadline if at least this many arrived"
    )
    on_shortfall: Literal["reopen", "fail"] = Field(
        "reopen",
        description="a round short of min_updates at its deadline: another deadline "
        "(at most max_reopens times), or the job fails",
    )
    max_reopens: int = Field(1, ge=0, le=100)
    selection: Literal["random", "oort"] = Field(
        "random",
        description="how each round's clients are chosen: at random, or by Oort's utility "
        "from FLStore's scheduling workload (random when the tracker cannot answer)",
    )
    drop_flagged: dict[str, Any] | None = Field(
        None,
        description='the debugging loop: {"workload": "multi-krum" or "cosine-to-aggregate", '
        '"params": {...}} drops from later rounds, before aggregation, the clients that '
        "FLStore's workload flags in a round",
    )
    weights_b64: str | None = Field(
        None,
        description="initial weights (safetensors, base64) for gateways that need them; "
        "omit to attach to a job already created on the root gateway",
    )


def metrics_text(coord: Coordinator) -> bytes:
    """The control plane's Prometheus metrics: ``fedfaas_control_job_rounds_completed``,
    ``fedfaas_control_job_updates_lost``, ``fedfaas_control_job_privacy_epsilon`` (spent so far) and
    ``fedfaas_control_job_privacy_budget`` (DP-FedAvg jobs with a budget), labelled by job;
    ``fedfaas_control_autoscale_failures_total``: scale decisions the provider refused or did not
    answer (after retrying a 5xx or no answer)."""
    registry = CollectorRegistry()
    Counter(
        "fedfaas_control_autoscale_failures",
        "autoscale decisions the provider refused or did not answer, after its retries",
        registry=registry,
    ).inc(coord.scale_failures)
    done = Gauge("fedfaas_control_job_rounds_completed", "rounds ended", ["job"], registry=registry)
    spent = Gauge(
        "fedfaas_control_job_privacy_epsilon",
        "epsilon spent by a DP-FedAvg job's rounds so far (at its delta)",
        ["job"],
        registry=registry,
    )
    budget = Gauge(
        "fedfaas_control_job_privacy_budget",
        "a DP-FedAvg job's epsilon budget",
        ["job"],
        registry=registry,
    )
    lost = Gauge(
        "fedfaas_control_job_updates_lost",
        "acknowledged updates in no published model (a dead node's, and those the gateways "
        "report dropped), over the job's rounds so far",
        ["job"],
        registry=registry,
    )
    for name, job in list(coord.jobs.items()):
        done.labels(name).set(job.completed)
        lost.labels(name).set(job.lost())
        if job.privacy:
            spent.labels(name).set(float(job.privacy.get("spent", 0.0)))
            if job.privacy.get("epsilon") is not None:
                budget.labels(name).set(float(job.privacy["epsilon"]))
    return bytes(generate_latest(registry))


def _coordinator(request: Request) -> Coordinator:
    coord: Coordinator = request.app.state.coordinator
    return coord


CoordDep = Annotated[Coordinator, Depends(_coordinator)]


def create_app(
    settings: ControlPlaneSettings | None = None, coordinator: Coordinator | None = None
) -> FastAPI:
    """Build the app; the coordinator (and its control loop) is attached in ``lifespan``."""
    settings = settings or ControlPlaneSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        coord = coordinator or _build(settings)
        await coord.start()
        app.state.coordinator = coord
        await secagg_stages.resume(app)  # a secure round's unmask stage a restart cut short
        tasks = [asyncio.create_task(coord.run(settings.tick_s))] if settings.tick_s > 0 else []
        discovery = (
            Discovery(settings.gateways_service, tls=settings.tls())
            if settings.gateways_service
            else None
        )
        if discovery is not None:
            static = settings.gateway_map()

            async def found(nodes: dict[str, str]) -> None:
                # --gateways entries win; the others are verified by their node's name
                named = set(nodes) - set(static) if discovery.scheme == "https" else set()
                await coord.update_nodes({**nodes, **static}, by_name=named)

            tasks.append(asyncio.create_task(discovery.watch(settings.discovery_interval, found)))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            if discovery is not None:
                await discovery.aclose()
            await coord.stop()

    app = private_app("FedFaaS control plane", lifespan=lifespan)

    def job_salt(job: str) -> str | None:
        coord: Coordinator | None = getattr(app.state, "coordinator", None)
        return None if coord is None else coord.salt_of(job)

    auth = Authenticator.from_files(settings.admin_token_file, settings.analyst_token_file)
    install(app, dataclasses.replace(auth, job_salt=job_salt))
    admin = [Depends(require())]
    analyst = [Depends(require(Scope.ANALYST))]

    @app.exception_handler(ControlPlaneError)
    async def cp_error(request: Request, exc: ControlPlaneError) -> JSONResponse:
        return JSONResponse(
            {"error": exc.code, "detail": exc.detail},
            status_code=exc.status,
            headers=exc.headers(),
        )

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {e.get('msg')}")
        return JSONResponse(
            {"error": "invalid_request", "detail": "; ".join(parts)}, status_code=422
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/metrics", dependencies=analyst)
    async def metrics(coord: CoordDep) -> Response:
        """Prometheus text format (a scrape sends an analyst or admin bearer token)."""
        return Response(metrics_text(coord), media_type="text/plain; version=0.0.4")

    @app.get("/v1/nodes", dependencies=analyst)
    async def nodes(coord: CoordDep) -> dict[str, Any]:
        """Node health, capacity and queue estimate."""
        est = coord.queues.estimates
        return {
            "nodes": [
                {
                    "name": h.name,
                    "url": h.url,
                    "tls_name": h.tls_name,
                    "healthy": h.healthy,
                    "mc": h.mc,
                    "queue_estimate": est.get(h.name, 0.0),
                    "failures": h.failures,
                }
                for h in coord.nodes.values()
            ],
            "autoscale": {
                "function": coord.function,
                "replicas": coord.last_scale,
                "error": coord.scale_error,
                "failures": coord.scale_failures,
            },
        }

    @app.post("/v1/jobs", status_code=201, dependencies=admin)
    async def create_job(body: JobIn, coord: CoordDep) -> dict[str, Any]:
        """Create a job on every healthy gateway and open its first round."""
        if isinstance(body.clients, int):
            if not 0 <= body.clients <= 1_000_000:
                raise InvalidInput("clients, as a count, must be in [1, 1000000]")
            clients = [f"c{i}" for i in range(body.clients)]
        else:
            clients = body.clients
        weights = b""
        if body.weights_b64:
            try:
                weights = base64.b64decode(body.weights_b64, validate=True)
            except binascii.Error as exc:
                raise InvalidInput(f"weights_b64 is not valid base64: {exc}") from None
        spec = JobSpec(
            body.job,
            body.rounds,
            body.goal,
            clients,
            body.overprovision,
            body.deadline_s,
            body.policy,
            body.per_leaf,
            body.size,
            body.min_updates,
            body.on_shortfall,
            body.max_reopens,
            body.selection,
            body.drop_flagged,
        )
        await coord.create_job(spec, initial_weights=weights)
        return {
            **coord.job_view(body.job),
            "tokens": coord.client_tokens(body.job),
            "enrollment_token": coord.enrollment_token(body.job),
        }

    @app.post(
        "/v1/jobs/{job}/clients", status_code=201, dependencies=[Depends(require(Scope.ENROLL))]
    )
    async def enroll(job: str, request: Request, coord: CoordDep) -> dict[str, Any]:
        """Enroll clients, ``{"clients": ["id", ...]}`` (at most 10,000 per call), with the
        job's enrollment token or the admin's; answers each one's bearer token. The body is
        read only once the token is checked."""
        try:
            raw = await request.json()
        except ValueError:
            raise InvalidInput('body must be JSON: {"clients": ["id", ...]}') from None
        ids = raw.get("clients") if isinstance(raw, dict) else None
        if (
            not isinstance(ids, list)
            or not 1 <= len(ids) <= MAX_ENROLL
            or not all(isinstance(c, str) for c in ids)
        ):
            raise InvalidInput(
                f'body must be {{"clients": ["id", ...]}} with 1 to {MAX_ENROLL} ids'
            )
        tokens = await coord.enroll(job, ids)
        return {"job": job, "tokens": tokens, "enrolled": len(coord.job(job).spec.clients)}

    @app.get("/v1/jobs/{job}", dependencies=[Depends(require(Scope.ANALYST, Scope.CLIENT))])
    async def get_job(job: str, coord: CoordDep) -> dict[str, Any]:
        """Job and current round (a client of the job asks with ``?client=ID``)."""
        return coord.job_view(job)

    @app.delete("/v1/jobs/{job}", status_code=204, dependencies=admin)
    async def delete_job(job: str, coord: CoordDep) -> None:
        """Forget the job."""
        await coord.delete_job(job)

    @app.delete("/v1/jobs/{job}/clients/{client}")
    async def revoke_client(
        scope: Annotated[Scope, Depends(require(Scope.CLIENT))],  # first: before any lookup
        job: str,
        client: str,
        coord: CoordDep,
        request: Request,
        force: Annotated[bool, Query()] = False,
    ) -> dict[str, Any]:
        """The admin revokes one client of the job (idempotent; 409 when too few would be
        left, unless ``force``), or a client leaves it (its own id, ``?client=`` the same):
        it is never selected again and its token is refused from then on."""
        if scope is Scope.CLIENT:
            if request.query_params.get("client") != client:
                raise AuthError(403, "a client may only take itself out of a job")
            force = True  # leaving is never refused; the job's rounds wait for enrollments
        return await coord.revoke_client(job, client, force=force)

    @app.post("/v1/jobs/{job}/rounds", status_code=201, dependencies=admin)
    async def open_round(job: str, coord: CoordDep) -> dict[str, Any]:
        """Open the next round."""
        return round_view(await coord.open_round(job))

    @app.post("/v1/jobs/{job}/rounds/{number}/close", dependencies=admin)
    async def close_round(job: str, number: int, coord: CoordDep) -> dict[str, Any]:
        """Close the open round now (it must be round ``number``)."""
        cur = coord.job(job).current
        if cur is None or cur.number != number or cur.state not in ("open", "aggregating"):
            raise RoundStateError(f"round {number} of {job!r} is not the open round")
        return round_view(await coord.close_round(job))

    @app.get("/v1/jobs/{job}/assignment", dependencies=[Depends(require(Scope.CLIENT))])
    async def assignment(
        job: str,
        coord: CoordDep,
        client: Annotated[str, Query(min_length=1, max_length=256)],
    ) -> dict[str, Any]:
        """Which node gateway a client uploads its update to (once the job is done: the one
        holding the final model)."""
        final = client_rounds.final_assignment(coord, job, client)
        if final is not None:
            return final
        number, node, url, resend = coord.assignment(job, client)
        return {
            "job": job,
            "round": number,
            "client": client,
            "node": node,
            "gateway_url": url,
            "tls_name": h.tls_name if (h := coord.nodes.get(node)) is not None else None,
            "resend": resend,
        }

    client_rounds.add_routes(app)
    secagg_stages.add_routes(app)

    @app.get("/v1/jobs/{job}/plan", dependencies=analyst)
    async def plan(job: str, coord: CoordDep) -> dict[str, Any]:
        """The open round's hierarchy as the gateway slot table."""
        state = coord.job(job)
        p = coord.plans.get(job)
        if p is None or state.current is None:
            raise RoundStateError(f"job {job!r} has no open round, so no plan")
        return plan_to_slots(
            p, state.current.assignment, dict(state.current.slot_ids), state.current.excluded
        )

    return app


#: clients one ``POST /v1/jobs/{job}/clients`` enrolls at most
MAX_ENROLL = 10_000


def _build(settings: ControlPlaneSettings) -> Coordinator:
    store: StateStore = (
        RedisStore(settings.redis_url, settings.redis_credentials_file)
        if settings.redis_url
        else MemoryStore()
    )
    # with TLS: every service this one calls is verified against the platform's CA, and this
    # service's certificate is presented (mTLS)
    tls = settings.tls()
    ctx = tls.client_context() if tls is not None else None
    verify = ctx if ctx is not None else True
    provider = None
    if settings.provider_url:
        try:
            auth = (
                read_basic_auth(settings.provider_auth_dir) if settings.provider_auth_dir else None
            )
        except OpenFaaSError as exc:
            raise InvalidInput(exc.detail) from exc
        provider = AsyncOpenFaaS(settings.provider_url, auth, verify=verify)
    token = None
    if settings.admin_token_file is not None:
        token = _token_file(settings.admin_token_file, "admin token")
    scheduler = None
    if settings.tracker_url and settings.tracker_token_file is not None:  # both, or neither
        scheduler = OortScheduler(
            settings.tracker_url,
            _token_file(settings.tracker_token_file, "tracker token"),
            timeout_s=settings.selection_timeout_s,
            verify=verify,
        )
    return Coordinator(
        settings.gateway_map(),
        mc=settings.mc,
        store=store,
        provider=provider,
        function=settings.function,
        alpha=settings.alpha,
        health_failures=settings.health_failures,
        node_grace_s=settings.node_grace_s,
        close_retries=settings.close_retries,
        admin_token=token,
        scale_down_after=settings.scale_down_s,
        scheduler=scheduler,
        gateway_tls=ctx,
    )


def _token_file(path: Path, what: str) -> str:
    try:
        return read_token_file(path, what)
    except AuthConfigError as exc:
        raise InvalidInput(str(exc)) from exc

"""Control routes (FastAPI): jobs, clients, model, progress, health, metrics.

The upload and internal-partial routes are native exchanges (``gateway.ingest``); everything
here is called through the server's ASGI bridge (``gateway.asgi``) before any body byte is
read: a route authenticates first, then reads its body (JSON: bounded by ``max_json_body``;
the job-creation body: streamed into shared memory).

Every route but ``/healthz`` needs a credential: the admin secret, or for a job's progress and
model, a client token of that job (a revoked client's: 403 ``client_revoked``). The credential
is checked before the job is looked up: without one, these routes (and the native upload
route) answer 401 for a job that does not exist too; the admin gets 404 ``unknown_job``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from core.auth import private_app
from gateway import auth, control, takeover, unmask
from gateway.asgi import receive_into
from gateway.bodies import SpooledBody
from gateway.errors import GatewayError, JobExists, Unauthorized
from gateway.jobs import check_job_params

if TYPE_CHECKING:
    from gateway.node import Node


class ModelNotFetched(GatewayError):
    """A non-root node knows of a model version but holds no bytes of it yet (its root
    journals a version before it serves it): ask again after ``Retry-After``. Its code is the
    generic ``unavailable`` the SDK already reads as "ask again" (``client.errors``)."""

    status = 503
    code = "unavailable"

    def headers(self) -> list[tuple[str, str]]:
        return [("retry-after", "1")]


def _admin(request: Request) -> None:
    """Refuse (401) a request without the admin bearer token (the gateways' shared secret)."""
    if not auth.check_admin(request.app.state.gateway.secret, request.headers.get("authorization")):
        raise Unauthorized("this route needs the admin bearer token (the gateways' admin secret)")


def _job_of(request: Request, job: str) -> Any:
    return request.app.state.gateway.job(job)


def _job_for_reader(request: Request, job: str) -> Any:
    """The job, for the admin or a client of it (401 otherwise; 403 for a revoked client)."""
    gw = request.app.state.gateway
    header = request.headers.get("authorization")
    if auth.check_admin(gw.secret, header):
        return gw.job(job)
    j = gw.jobs.get(job)
    client = None if j is None else j.client_of(header)
    if j is None or client is None:
        raise Unauthorized(
            f"a client bearer token of job {job!r} (from its creation answer) or the admin "
            f"bearer token is required"
        )
    if client in j.revoked:
        raise j.revoked_error(client)
    return j


ADMIN = [Depends(_admin)]
JobDep = Annotated[Any, Depends(_job_of)]  # on admin routes: the admin check runs first
ReadJobDep = Annotated[Any, Depends(_job_for_reader)]


def build_app(gw: Node) -> FastAPI:
    app = private_app("FedFaaS node gateway", version="1")
    app.state.gateway = gw

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        gw.metrics.rejected.labels(exc.code).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=dict(exc.headers()))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": "bad_request", "detail": where}, status_code=400)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        """Liveness plus the router mode and why."""
        return {
            "status": "ok",
            "node": gw.settings.node,
            "router": gw.router.mode,
            "router_reason": gw.router.reason,
            "jobs": len(gw.jobs),
            "aggregators": control.node_load(gw),
        }

    @app.get("/metrics", dependencies=ADMIN)
    async def metrics() -> Response:
        """Prometheus text format (a scrape sends the admin secret as its bearer token)."""
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/router", dependencies=ADMIN)
    async def router() -> dict[str, Any]:
        """Router mode and why, endpoints with their metrics (E from the kernel), drops."""
        return gw.router.status()

    @app.post("/v1/jobs", status_code=201, dependencies=ADMIN)
    async def create_job(
        request: Request,
        job: Annotated[str, Query()],
        rounds: Annotated[int, Query()],
        goal: Annotated[int, Query()],
        clients: Annotated[str, Query()] = "",
        nodes: Annotated[str | None, Query()] = None,
        resume: Annotated[bool, Query()] = False,
    ) -> dict[str, object]:
        """Create a job from its initial weights (safetensors body) or its last checkpoint.

        The answer carries each client's token and the job's fresh ``salt`` (a resumed job is
        a new incarnation: new salt, new tokens).
        """
        ids = [c for c in clients.split(",") if c]
        where = check_job_params(
            job, rounds, goal, ids, nodes.split(",") if nodes else None, gw.settings.node
        )
        async with job_body(gw, request, job, resume) as body:
            j = await gw.create_job(job, rounds, goal, ids, where, body, resume=resume)
        return {
            "job": j.name,
            "round": j.version + 1,
            "version": j.version,
            "spec": j.spec.to_json(),
            "tokens": dict(j.tokens),
            "salt": j.salt,
            "id": j.id,
            "plan": j.plan.to_json(),
        }

    @app.delete("/v1/jobs/{job}", status_code=204, dependencies=ADMIN)
    async def delete_job(j: JobDep) -> Response:
        """Delete a job: its store objects on this node and, on its root node, its journal."""
        await gw.delete_job(j.name)
        return Response(status_code=204)

    @app.delete("/v1/jobs/{job}/clients/{client}", dependencies=ADMIN)
    async def revoke_client(
        j: JobDep, client: str, force: Annotated[bool, Query()] = False
    ) -> dict[str, object]:
        """Revoke one client of the job (idempotent): see :func:`gateway.membership.revoke_client`."""
        return await gw.revoke_client(j, client, force=force)

    @app.get("/v1/jobs", dependencies=ADMIN)
    async def list_jobs() -> dict[str, object]:
        """Jobs on this node."""
        return {"jobs": [j.status() for j in gw.jobs.values()]}

    @app.get("/v1/jobs/{job}")
    async def job_status(request: Request, j: ReadJobDep) -> dict[str, object]:
        """Round, version, progress of the open round, and the load: queue = k * E.

        The admin also reads the job's ``salt``, its ``revoked`` clients and its ``store``.
        """
        status: dict[str, object] = j.status()
        status.update(gw.load(j))
        status["plan_version"] = j.engine.plan_version if j.engine is not None else None
        status["pushed_plan"] = j.plan is not j.base_plan
        if auth.check_admin(gw.secret, request.headers.get("authorization")):
            status["salt"] = j.salt
            status["revoked"] = sorted(j.revoked)
        else:  # a client: not where the node keeps the job's objects
            status.pop("store", None)
            status.pop("store_stats", None)
        return status

    @app.put("/v1/jobs/{job}/rounds/{number}/plan", dependencies=ADMIN)
    async def put_plan(request: Request, j: JobDep, number: int) -> dict[str, object]:
        """Take the control plane's slot table for round ``number`` (open or next)."""
        data = await _json(request)
        await gw.follow_root(j)  # the plan may put the top on a node that just took over
        answer = gw.push_plan(j, number, data)
        await control.persist_plan(gw, j, number)
        return answer

    @app.post("/v1/jobs/{job}/adopt", dependencies=ADMIN)
    async def adopt(request: Request, j: JobDep) -> dict[str, object]:
        """Take the job over from its dead root node, ``{"from": "<node>"}``: this node
        becomes its root (see :mod:`gateway.takeover`)."""
        body = await _json(request)
        dead = body.get("from") if isinstance(body, dict) else None
        if not isinstance(dead, str) or dead not in j.nodes or dead == gw.settings.node:
            raise GatewayError(
                f'body must be {{"from": "<the dead root node>"}}, one of the job\'s other '
                f"nodes {[n for n in j.nodes if n != gw.settings.node]}",
                status=422,
                code="bad_adopt",
            )
        return await takeover.adopt(gw, j, dead)

    @app.post("/v1/jobs/{job}/rounds/{number}/close", dependencies=ADMIN)
    async def close_round(request: Request, j: JobDep, number: int) -> dict[str, object]:
        """Close the round's intake here; with ``{"received": {node: n}}`` aggregate those."""
        body = await _json(request) if await request.body() else {}
        received = body.get("received") if isinstance(body, dict) else None
        if received is not None and (
            not isinstance(received, dict)
            or not all(
                isinstance(n, str) and isinstance(c, int) and not isinstance(c, bool) and c >= 0
                for n, c in received.items()
            )
        ):
            raise GatewayError(
                'body must be {"received": {"<node>": <updates >= 0>, ...}} or empty',
                status=422,
                code="bad_close",
            )
        answer = gw.close_round(j, number, received)
        await control.persist_plan(gw, j, number)
        return answer

    @app.get("/v1/jobs/{job}/model")
    async def model(
        j: ReadJobDep,
        if_none_match: Annotated[str | None, Header()] = None,
    ) -> Response:
        """The current global model as safetensors (ETag "v<version>"). A non-root node that
        holds no bytes of its version yet (the root journals a version before it serves it)
        answers 503 ``unavailable`` with ``Retry-After``, never a 200 without them."""
        if j.node != j.root and (
            not j.model_bytes
            or gw.journal is not None
            and await gw.journal.version(j.name) > j.version
        ):
            await gw.fetch_root_model(j)
        etag = f'"v{j.version}"'
        headers = {"ETag": etag, "X-Model-Version": str(j.version)}
        if if_none_match is not None and etag in [t.strip() for t in if_none_match.split(",")]:
            return Response(status_code=304, headers=headers)
        if not j.model_bytes:  # the root journaled a version it does not serve yet
            raise ModelNotFetched(
                f"node {j.node} is fetching model version {j.version} of job {j.name!r} from "
                f"its root node {j.root}; ask again after Retry-After"
            )
        return Response(j.model_bytes, media_type="application/octet-stream", headers=headers)

    unmask.add_routes(app)
    return app


@contextlib.asynccontextmanager
async def job_body(gw: Node, request: Request, job: str, resume: bool) -> AsyncIterator[memoryview]:
    """The job-creation body, received straight into shared memory (freed on exit).

    Checked before a byte is read: its size (``max_job_body``), no body with ``resume``, a
    free job name. Its bytes are held against the node's budget as they arrive.
    """
    n = int(request.headers.get("content-length") or 0)
    if n > gw.settings.max_job_body:
        raise GatewayError(
            f"initial weights of {n} bytes exceed the bound of {gw.settings.max_job_body} "
            f"(max_job_body)",
            status=413,
            code="body_too_large",
        )
    if resume and n:
        raise GatewayError(
            "resume=true takes the model from the last checkpoint: send no body",
            code="body_with_resume",
        )
    if job in gw.jobs or await gw.journal.job(job) is not None:
        raise JobExists(f"job {job!r} exists; pick another name")
    with SpooledBody(n, "fedfaas-job-body") as body:
        await receive_into(request.scope, body.view, f"the initial weights of job {job!r}")
        yield body.view


async def _json(request: Request) -> Any:
    import json

    try:
        return json.loads(await request.body())
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
        raise GatewayError("body must be JSON", status=400, code="bad_json") from None

"""HTTP surface of the cache engine (FastAPI).

Routes: ``GET /healthz``, ``GET /metrics``, ``GET /v1/state``, ``POST /v1/jobs/{job}/rounds/{round}/complete``
(ingest a written round), ``POST /v1/acquire`` (a query's objects cached; returns holders),
``POST /v1/touch`` (queries the tracker answered on plans it kept), ``POST /v1/plan`` (validate
only), ``GET /v1/locations?ids=...``, ``POST /v1/functions/{name}/failed``,
``GET /v1/replicas``, ``GET /v1/idle``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from cache_engine.cold_store import MinioColdStore
from cache_engine.engine import CacheEngine, handoff_problem
from cache_engine.errors import EngineError
from cache_engine.keys import ObjectKey
from cache_engine.settings import EngineSettings
from core.auth import Authenticator, Scope, install, private_app, require
from core.openfaas import OpenFaaS, read_basic_auth
from core.secretfiles import read_credentials, redis_client

log = logging.getLogger(__name__)
QUERY_SHAPE = "the body must be a JSON object {workload, job, rounds, clients, params}"
#: the most queries one ``POST /v1/touch`` may carry
MAX_TOUCH = 1000


def _error(status: int, body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def create_app(settings: EngineSettings | None = None) -> FastAPI:
    """The engine app; resources are attached in ``lifespan``."""
    s = settings or EngineSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        r = redis_client(s.redis_url, s.redis_credentials_file, decode_responses=True)
        # the launcher creates the bucket; this user only reads it (and mints read grants)
        cold = MinioColdStore(
            s.minio_endpoint, minio.username, minio.password, s.bucket, create=False
        )
        # with TLS: the runtime verified against the platform's CA, this engine's certificate
        # presented
        tls = s.tls()
        verify = tls.client_context() if tls is not None else True
        openfaas = OpenFaaS(s.runtime_url, runtime_auth, timeout=30.0, verify=verify)
        engine = CacheEngine(s, r, cold, openfaas)
        engine.start()
        app.state.engine = engine
        try:
            yield
        finally:
            engine.stop()
            openfaas.close()
            r.close()

    auth = Authenticator.from_files(s.admin_token_file, service=s.service_token_file)
    # read at start, like the tokens: a missing or bad credentials file stops the engine here
    minio = read_credentials(s.minio_credentials_file, "MinIO")
    read_credentials(s.redis_credentials_file, "Redis")
    # the provider's basic auth, when given, must be there: never a silent unauthenticated call
    runtime_auth = read_basic_auth(s.runtime_auth_dir) if s.runtime_auth_dir else None
    app = private_app("FLStore cache engine", lifespan=lifespan)
    install(app, auth)
    service = [Depends(require(Scope.SERVICE))]

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return _error(exc.status, exc.to_dict())

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, {"error": "bad_request", "detail": QUERY_SHAPE})

    try:
        from flstore_workloads import WorkloadError

        @app.exception_handler(WorkloadError)
        async def _workload_error(_: Request, exc: WorkloadError) -> JSONResponse:
            return _error(int(getattr(exc, "status", 400)), exc.to_dict())
    except ImportError:  # pragma: no cover - workloads package not installed
        pass

    def eng(request: Request) -> CacheEngine:
        e: CacheEngine = request.app.state.engine
        return e

    @app.get("/healthz")
    def healthz(request: Request) -> dict[str, Any]:
        """Liveness."""
        e = eng(request)
        return {"ok": True, "objects": len(e.table), "functions": len(e.functions)}

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=service)
    def metrics(request: Request) -> str:
        """Counters in Prometheus text format."""
        e = eng(request)
        lines = [f"flstore_engine_{k} {v}" for k, v in sorted(e.stats.items())]
        lines.append(f"flstore_engine_objects {len(e.table)}")
        lines.append(f"flstore_engine_functions {len(e.functions)}")
        return "\n".join(lines) + "\n"

    @app.get("/v1/state", dependencies=service)
    def state(request: Request) -> dict[str, Any]:
        """Functions, jobs, counters."""
        return eng(request).describe()

    @app.post("/v1/jobs/{job}/rounds/{rnd}/complete", dependencies=service)
    async def complete(job: str, rnd: int, request: Request) -> Any:
        """A round is written to the cold store: ingest it. An optional JSON body
        ``{"handoff": {"socket", "ticket", "node"}}`` (from the job's root gateway) says where
        this node's cache functions may claim the round's updates in place."""
        handoff = None
        if await request.body():
            body = await _json(request)
            if isinstance(body, JSONResponse):
                return body
            handoff = body.get("handoff")
            problem = handoff_problem(handoff)
            if problem:
                return _error(400, {"error": "bad_handoff", "detail": problem})
        return await run_in_threadpool(eng(request).ingest, job, rnd, handoff)

    @app.post("/v1/plan", dependencies=service)
    async def plan_(request: Request) -> Any:
        """Validate a query; list the objects it needs."""
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return body
        e = eng(request)
        p = e.plan(body)
        if p.evaluator and p.query.job not in e.evaluators:
            from cache_engine.errors import NoEvaluator

            raise NoEvaluator(
                f"workload {p.query.workload!r} needs a validation-set evaluator "
                f"and job {p.query.job!r} declares none",
                job=p.query.job,
            )
        return {"objects": [k.id for k in p.keys], "policy": p.policy, "params": p.params}

    @app.post("/v1/acquire", dependencies=service)
    async def acquire(request: Request) -> Any:
        """Cache a query's objects; return the functions holding all of them. A query whose
        objects a function holds already is answered on the event loop; one that loads or
        waits runs in the thread pool."""
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return _error(400, {"error": "bad_request", "detail": QUERY_SHAPE})
        e = eng(request)
        out = e.acquire_held(body)
        if out is None:
            out = await run_in_threadpool(e.acquire, body)
        return JSONResponse(out)

    @app.post("/v1/touch", dependencies=service)
    async def touch(request: Request) -> Any:
        """``{"queries": [query, ...]}``: queries the request tracker answered on plans it
        kept, without ``/v1/acquire``; the policy sees each as a request."""
        body = await _json(request)
        if isinstance(body, JSONResponse):
            return body
        qs = body.get("queries")
        if (
            not isinstance(qs, list)
            or not all(isinstance(q, dict) for q in qs)
            or len(qs) > MAX_TOUCH
        ):
            return _error(
                400,
                {
                    "error": "bad_touch",
                    "detail": f"'queries' must be a list of at most {MAX_TOUCH} query objects",
                },
            )
        return {"counted": await run_in_threadpool(eng(request).touch, qs)}

    @app.get("/v1/locations", dependencies=service)
    def locations(request: Request, ids: list[str] = Query(default=[])) -> dict[str, Any]:  # noqa: B008
        """Holders of objects, primary first."""
        return eng(request).locations(ids)

    @app.post("/v1/functions/{name}/failed", dependencies=service)
    def failed(name: str, request: Request) -> dict[str, Any]:
        """A caller could not reach function ``name``."""
        return {"function": name, "alive": eng(request).report_failure(name)}

    @app.post("/v1/functions/{name}/missing", dependencies=service)
    def missing(name: str, request: Request, body: dict[str, Any]) -> Any:
        """Function ``name`` answered 409 not_held for these objects: fix the table."""
        ids = body.get("objects")
        try:
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ValueError
            for i in ids:
                ObjectKey.parse(i)
        except ValueError:
            return _error(
                400,
                {
                    "error": "bad_request",
                    "detail": "'objects' must be a list of object ids (job/round/client, "
                    "job/round/global or job/round/meta)",
                },
            )
        return {"corrected": eng(request).report_missing(name, ids)}

    @app.get("/v1/replicas", dependencies=service)
    def replicas(request: Request) -> dict[str, Any]:
        """Holders per cached object."""
        return eng(request).replica_counts()

    @app.get("/v1/idle", dependencies=service)
    def idle(request: Request) -> dict[str, bool]:
        """Whether background prefetch/eviction/restoration is done."""
        return {"idle": eng(request).idle()}

    return app


async def _json(request: Request) -> Any:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, {"error": "bad_json", "detail": "the body must be a JSON object"})
    if not isinstance(body, dict):
        return _error(400, {"error": "bad_json", "detail": "the body must be a JSON object"})
    return body

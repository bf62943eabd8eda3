"""HTTP surface of the request tracker (FastAPI).

``POST /v1/queries`` (``?wait=true`` answers with the result), ``GET /v1/queries/{id}``,
``GET /healthz``, ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from core.auth import Authenticator, Scope, install, private_app, require
from core.secretfiles import async_redis_client, read_credentials
from request_tracker.errors import TrackerError
from request_tracker.settings import TrackerSettings
from request_tracker.tracker import Tracker


def create_app(settings: TrackerSettings | None = None) -> FastAPI:
    """The tracker app; Redis and HTTP clients are attached in ``lifespan``."""
    s = settings or TrackerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        r = async_redis_client(s.redis_url, s.redis_credentials_file, decode_responses=True)
        tracker = Tracker(s, r)
        await tracker.start()
        app.state.tracker = tracker
        try:
            yield
        finally:
            await tracker.close()
            await r.aclose()

    auth = Authenticator.from_files(s.admin_token_file, analyst=s.analyst_token_file)
    read_credentials(s.redis_credentials_file, "Redis")  # a bad file stops the tracker here
    app = private_app("FLStore request tracker", lifespan=lifespan)
    install(app, auth)
    analyst = [Depends(require(Scope.ANALYST))]

    @app.exception_handler(TrackerError)
    async def _tracker_error(_: Request, exc: TrackerError) -> JSONResponse:
        retry = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body, status_code=exc.status, headers=retry)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {
                "error": "bad_request",
                "detail": "the body must be a JSON object {workload, job, rounds, clients, params}",
            },
            status_code=400,
        )

    def tr(request: Request) -> Tracker:
        t: Tracker = request.app.state.tracker
        return t

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        """Liveness (and whether Redis answers)."""
        await tr(request).redis.ping()
        return {"ok": True}

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=analyst)
    async def metrics(request: Request) -> str:
        """Counters and latency percentiles in Prometheus text format."""
        return "".join(
            f"flstore_tracker_{k} {v}\n" for k, v in sorted(tr(request).metrics().items())
        )

    @app.post("/v1/queries", dependencies=analyst)
    async def submit(request: Request, wait: bool = False) -> Any:
        """Submit a query; with ``?wait=true`` the answer is the finished record."""
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "bad_json", "detail": "the body must be JSON"}, 400)
        if not isinstance(body, dict):
            return JSONResponse(
                {
                    "error": "bad_request",
                    "detail": "the body must be a JSON "
                    "object {workload, job, rounds, clients, params}",
                },
                400,
            )
        out = await tr(request).submit(body, wait)
        return JSONResponse(out, status_code=200 if wait else 202)

    @app.get("/v1/queries/{qid}", dependencies=analyst)
    async def get(qid: str, request: Request) -> Any:
        """Status, functions tried, result or error of a query."""
        rec = await tr(request).get(qid)
        if rec is None:
            return JSONResponse(
                {
                    "error": "unknown_query",
                    "detail": f"no query {qid!r} (a background query's id is kept for "
                    "result_ttl seconds, an answered one's for answered_ttl)",
                },
                404,
            )
        return rec

    return app

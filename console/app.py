"""The console's HTTP app (FastAPI): pages, their JSON, the login.

Routes (every one but ``/healthz``, the login and the two static files needs a login; the
``api`` ones answer JSON, the others HTML):

* ``GET /healthz``; ``GET /login`` (the form), ``POST /login`` (the token in a form body: a
  session cookie, HttpOnly and SameSite=Strict), ``POST /logout``
* ``GET /``, ``/jobs``, ``/jobs/{job}``, ``/flstore``, ``/checkpoints``: the pages (analyst);
  ``GET /dataplane`` (admin)
* ``GET /api/overview``: nodes, gateways and their router mode, the ``aggregator`` replicas,
  the FLStore functions, each service's health, the version (the admin also sees each
  gateway's router endpoints)
* ``GET /api/jobs``, ``GET /api/jobs/{job}`` (the control plane's view, its rounds' timeline
  and the open round's stragglers), ``GET /api/jobs/{job}/series`` (loss and accuracy per
  round: FLStore's ``track`` and ``evaluate``, the newest :data:`SERIES_ROUNDS`)
* ``POST /api/queries``: an FLStore query, answered with its result and cost (analyst, CSRF)
* ``POST /api/jobs/{job}/stop``: stop and forget a job (admin, CSRF)
* ``POST /api/jobs/{job}/clients/{client}/revoke[?force=true]``: revoke one client of the job:
  the control plane's revocation, which every gateway of the job then enforces (admin, CSRF)
* ``GET /api/dataplane``: per node gateway its router's endpoints with their counters (the eBPF
  map's or the userspace router's), the refused frames, its store's objects and bytes per job,
  its ingest and their rates (admin: the gateways show these to their admin alone)
* ``GET /api/checkpoints[?job=]``: the bucket's jobs, a job's objects with presigned links

Every answer carries a Content-Security-Policy and ``Cache-Control: no-store`` (the static
files aside). A page asked without a login redirects to ``/login``; JSON answers 401.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from console import pages, views
from console.checkpoints import Checkpoints
from console.dataplane import Rates
from console.sessions import COOKIE, LoginRequired, Session, Sessions, require_session
from console.settings import ConsoleSettings
from console.upstream import Upstream, UpstreamError
from control_plane.jobs import CLIENT_ID
from core.auth import Authenticator, AuthError, Scope, private_app

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
#: static files by route, with their media types
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
#: bytes a login form or a query body may have
MAX_LOGIN_BODY = 4096
MAX_QUERY_BODY = 64 * 1024
#: the newest rounds the job page's loss and accuracy chart shows
SERIES_ROUNDS = 20

ANALYST = require_session(Scope.ANALYST)
ADMIN = require_session()
AnalystSession = Annotated[Session, Depends(ANALYST)]
AdminSession = Annotated[Session, Depends(ADMIN)]


class BadInput(Exception):
    """A request the console refuses: 4xx ``{"error", "detail"}``."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past ``limit`` bytes, by its Content-Length or as it streams."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BadInput(413, "body_too_large", f"the body may have at most {limit} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadInput(413, "body_too_large", f"the body may have at most {limit} bytes")
    return body


def _query_body(raw: bytes) -> dict[str, Any]:
    """The tracker's query from the form's JSON: ``{workload, job, round | rounds, params}``."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadInput(400, "bad_json", "the body must be JSON") from None
    if not isinstance(body, dict):
        raise BadInput(400, "bad_request", "the body must be a JSON object")
    workload, job = body.get("workload"), body.get("job")
    params = body.get("params") or {}
    if not isinstance(workload, str) or not workload:
        raise BadInput(400, "bad_request", "workload: a workload name is required")
    if not isinstance(job, str) or not job:
        raise BadInput(400, "bad_request", "job: a job name is required")
    if not isinstance(params, dict):
        raise BadInput(400, "bad_request", "params: must be a JSON object")
    query: dict[str, Any] = {"workload": workload, "job": job, "params": params}
    rnd = body.get("round")
    if rnd is not None:
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 1:
            raise BadInput(400, "bad_request", "round: must be an integer >= 1")
        query["rounds"] = [rnd]
        params.setdefault("round", rnd)
    return query


def _force(raw: str | None) -> bool:
    """``?force=``: ``true`` or ``false`` (absent: false)."""
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise BadInput(400, "bad_request", f"force: must be true or false, not {raw[:40]!r}")


def create_app(settings: ConsoleSettings | None = None) -> FastAPI:
    """The console app; its token files and MinIO credentials are read here (a bad one stops
    the console at start)."""
    s = settings or ConsoleSettings()
    auth = Authenticator.from_files(s.admin_token_file, analyst=s.analyst_token_file)
    s.gateway_map()  # a malformed --gateways stops the console here, not at a request
    upstream = Upstream(s)
    checkpoints = Checkpoints(s)
    rates = Rates()  # the data plane's counters between polls, for its rates
    assets = {name: (STATIC / name).read_bytes() for name in ASSETS}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await upstream.aclose()

    app = private_app("FedFaaS console", lifespan=lifespan)
    app.state.auth = auth
    app.state.sessions = Sessions(s.session_ttl_s)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        resp = await call_next(request)
        resp.headers["Content-Security-Policy"] = pages.CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["X-Frame-Options"] = "DENY"
        if not request.url.path.startswith("/static/"):
            resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.exception_handler(AuthError)
    async def auth_error(request: Request, exc: AuthError) -> Response:
        page = request.method == "GET" and not request.url.path.startswith("/api/")
        if isinstance(exc, LoginRequired) and page:
            return RedirectResponse("/login", status_code=303)
        error = "unauthorized" if exc.status == 401 else "forbidden"
        return JSONResponse({"error": error, "detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(UpstreamError)
    async def upstream_error(request: Request, exc: UpstreamError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(BadInput)
    async def bad_input(request: Request, exc: BadInput) -> JSONResponse:
        return JSONResponse({"error": exc.error, "detail": exc.detail}, status_code=exc.status)

    # --- open: health, login, static files --------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/login")
    async def login_form() -> HTMLResponse:
        """The login form."""
        return HTMLResponse(pages.login())

    @app.post("/login")
    async def login(request: Request) -> Response:
        """Log in with the admin or analyst token (form field ``token``)."""
        form = parse_qs((await _bounded_body(request, MAX_LOGIN_BODY)).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        scope = auth.scope_of(token, request) if token else None
        if scope not in (Scope.ADMIN, Scope.ANALYST):
            return HTMLResponse(pages.login("That is not the admin or analyst token."), 401)
        sid, _ = app.state.sessions.open(scope, token)
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(
            COOKIE,
            sid,
            max_age=int(s.session_ttl_s),
            path="/",
            httponly=True,
            samesite="strict",
            secure=s.secure_cookie,
        )
        return resp

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        """The script and the style sheet (no data in them: open, as the login page needs)."""
        if name not in assets:
            return JSONResponse({"error": "not_found", "detail": f"no {name!r}"}, 404)
        return Response(assets[name], media_type=ASSETS[name])

    # --- pages ------------------------------------------------------------------------------

    def html(name: str, title: str, session: Session, job: str = "") -> HTMLResponse:
        return HTMLResponse(pages.page(name, title, session.scope.value, session.csrf, job))

    @app.get("/")
    async def overview_page(session: AnalystSession) -> HTMLResponse:
        return html("overview", "Overview", session)

    @app.get("/jobs")
    async def jobs_page(session: AnalystSession) -> HTMLResponse:
        return html("jobs", "Jobs", session)

    @app.get("/jobs/{job}")
    async def job_page(job: str, session: AnalystSession) -> HTMLResponse:
        return html("job", f"Job {job}", session, job)

    @app.get("/flstore")
    async def flstore_page(session: AnalystSession) -> HTMLResponse:
        return html("flstore", "FLStore", session)

    @app.get("/checkpoints")
    async def checkpoints_page(session: AnalystSession) -> HTMLResponse:
        return html("checkpoints", "Checkpoints", session)

    @app.get("/dataplane")
    async def dataplane_page(session: AdminSession) -> HTMLResponse:
        return html("dataplane", "Data plane", session)

    @app.post("/logout")
    async def logout(request: Request, session: AnalystSession) -> JSONResponse:
        """End the session (its cookie is cleared)."""
        app.state.sessions.close(request.cookies.get(COOKIE))
        resp = JSONResponse({"ok": True})
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return resp

    # --- JSON -------------------------------------------------------------------------------

    @app.get("/api/overview")
    async def overview(session: AnalystSession) -> dict[str, Any]:
        admin = session.token if session.scope is Scope.ADMIN else None
        return await upstream.overview(admin)

    @app.get("/api/jobs")
    async def jobs(session: AnalystSession) -> dict[str, Any]:
        return {"jobs": await upstream.jobs()}

    @app.get("/api/jobs/{job}")
    async def job(job: str, session: AnalystSession) -> dict[str, Any]:
        view = await upstream.job(job)
        return {
            "view": view,
            "timeline": views.timeline(view),
            "stragglers": views.stragglers(view),
        }

    @app.get("/api/jobs/{job}/series")
    async def series(job: str, session: AnalystSession) -> dict[str, Any]:
        view = await upstream.job(job)
        history = view.get("history") or []
        rounds = [int(h["round"]) for h in history if h.get("state") == "closed"]
        rounds = rounds[-SERIES_ROUNDS:]

        async def answer(workload: str, params: dict[str, Any]) -> dict[str, Any] | None:
            try:
                out = await upstream.query({"workload": workload, "job": job, "params": params})
            except UpstreamError as exc:  # e.g. a job without an evaluator: no point
                log.info("%s of %s: %s", workload, job, exc)
                return None
            result = out.get("result")
            return result if isinstance(result, dict) else None

        tracks = [answer("track", {"round": r, "window": 1}) for r in rounds]
        evals = [answer("evaluate", {"round": r}) for r in rounds]
        done = await asyncio.gather(*tracks, *evals)
        return views.series(rounds, list(done[: len(rounds)]), list(done[len(rounds) :]))

    @app.post("/api/queries")
    async def query(request: Request, session: AnalystSession) -> dict[str, Any]:
        body = _query_body(await _bounded_body(request, MAX_QUERY_BODY))
        answer = await upstream.query(body)
        return {
            "query": body,
            "result": answer.get("result"),
            "latency_s": answer.get("latency_s"),
            "hit": answer.get("hit"),
            "function": answer.get("function"),
        }

    @app.post("/api/jobs/{job}/stop")
    async def stop(job: str, session: AdminSession) -> dict[str, Any]:
        await upstream.stop_job(job, session.token)
        return {"job": job, "stopped": True}

    @app.post("/api/jobs/{job}/clients/{client}/revoke")
    async def revoke(
        job: str, client: str, session: AdminSession, force: str | None = None
    ) -> dict[str, Any]:
        if not CLIENT_ID.match(client):
            raise BadInput(400, "bad_request", f"client: an id matching {CLIENT_ID.pattern}")
        return await upstream.revoke_client(job, client, _force(force), session.token)

    @app.get("/api/dataplane")
    async def data_plane(session: AdminSession) -> dict[str, Any]:
        return await upstream.data_plane(session.token, rates)

    @app.get("/api/checkpoints")
    async def checkpoint_list(session: AnalystSession, job: str | None = None) -> dict[str, Any]:
        return await checkpoints.listing(job)

    return app

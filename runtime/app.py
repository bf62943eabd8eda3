"""The runtime's HTTP surface: the OpenFaaS gateway/provider API on one FastAPI app."""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from core.auth import private_app
from core.secretfiles import async_redis_client, read_credentials
from runtime.async_calls import AsyncCalls, admit
from runtime.auth import REALM_HEADER, BasicAuth
from runtime.errors import (
    AsyncNotConfigured,
    FaasRuntimeError,
    FunctionNotFound,
    InvalidRequest,
    Unauthorized,
)
from runtime.logs import parse_time, stream_logs
from runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from runtime.metrics import GatewayMetrics
from runtime.models import (
    DeleteFunctionRequest,
    FunctionDeployment,
    ScaleServiceRequest,
    Secret,
    parse_body,
)
from runtime.provider import Provider
from runtime.proxy import ALLOWED_METHODS, make_client, proxy_function
from runtime.settings import VERSION, RuntimeSettings
from runtime.validation import split_namespace

log = logging.getLogger(__name__)


def _provider(request: Request) -> Provider:
    return request.app.state.provider  # type: ignore[no-any-return]


def _check_auth(request: Request) -> None:
    auth: BasicAuth = request.app.state.auth
    auth.check(request.headers.get("authorization"))


ProviderDep = Annotated[Provider, Depends(_provider)]
system = APIRouter(prefix="/system", dependencies=[Depends(_check_auth)])


def _name(provider: Provider, raw: str, namespace: str | None) -> str:
    """``fn`` or ``fn.openfaas-fn`` plus ``?namespace=`` -> the function name (400 if foreign)."""
    name, ns = split_namespace(raw)
    provider.check_namespace(ns)
    provider.check_namespace(namespace)
    return name


@system.get("/functions")
async def list_functions(provider: ProviderDep, namespace: str | None = None) -> JSONResponse:
    """List deployed functions (FunctionStatus array)."""
    provider.check_namespace(namespace)
    return JSONResponse(provider.list_status())


@system.post("/functions", status_code=202)
async def deploy_function(request: Request, provider: ProviderDep) -> Response:
    """Deploy a new function: 202, or 400 with what was wrong."""
    await provider.deploy(parse_body(FunctionDeployment, await request.body()))
    return Response(status_code=202)


@system.put("/functions", status_code=202)
async def update_function(request: Request, provider: ProviderDep) -> Response:
    """Update a function: 202, 404 if unknown (faas-cli then POSTs)."""
    await provider.update(parse_body(FunctionDeployment, await request.body()))
    return Response(status_code=202)


@system.delete("/functions", status_code=202)
async def delete_function(
    request: Request, provider: ProviderDep, namespace: str | None = None
) -> Response:
    """Delete a function: 202, 404 if unknown, 400 for an empty body."""
    body = parse_body(DeleteFunctionRequest, await request.body())
    if not body.functionName:
        raise InvalidRequest("functionName is required")
    name = _name(provider, body.functionName, namespace or body.namespace)
    await provider.delete(name)
    return Response(status_code=202)


@system.get("/function/{name}")
async def function_status(
    name: str, provider: ProviderDep, namespace: str | None = None, usage: str | None = None
) -> Response:
    """One FunctionStatus; 404 with an empty body when unknown."""
    fn = _name(provider, name, namespace)
    if not provider.exists(fn):
        return Response(status_code=404)
    return JSONResponse(provider.status(fn))


@system.post("/scale-function/{name}", status_code=202)
async def scale_function(name: str, request: Request, provider: ProviderDep) -> Response:
    """Set the replica count: 202; 400 for 0; clamped to ``com.openfaas.scale.max``."""
    body = parse_body(ScaleServiceRequest, await request.body())
    fn = _name(provider, name, body.namespace or request.query_params.get("namespace"))
    await provider.scale(fn, body.replicas)
    return Response(status_code=202)


@system.get("/replicas/{name}")
async def function_replicas(name: str, provider: ProviderDep) -> JSONResponse:
    """FedFaaS extension: each replica's pid, port, state and log file."""
    return JSONResponse(provider.replicas(_name(provider, name, None)))


@system.get("/info")
async def info(request: Request) -> JSONResponse:
    """GatewayInfo, or behind OpenFaaS's gateway (``behind_gateway``) a provider's
    ProviderInfo, which that gateway wraps in its GatewayInfo."""
    version = {"sha": "embedded", "release": VERSION}
    provider = {"provider": "fedfaas-runtime", "orchestration": "process", "version": version}
    if request.app.state.settings.behind_gateway:
        return JSONResponse(provider)
    return JSONResponse(
        {
            "provider": provider,
            "version": {**version, "commit_message": "FedFaaS embedded runtime"},
            "arch": platform.machine(),
        }
    )


@system.get("/namespaces")
async def namespaces(provider: ProviderDep) -> JSONResponse:
    """The one function namespace."""
    return JSONResponse([provider.namespace])


@system.get("/secrets")
async def list_secrets(provider: ProviderDep, namespace: str | None = None) -> JSONResponse:
    """``[{"name", "namespace"}]``: the secrets' names, never their values."""
    provider.check_namespace(namespace)
    return JSONResponse(provider.list_secrets())


async def _secret(request: Request, provider: ProviderDep) -> Secret:
    body = parse_body(Secret, await request.body())
    provider.check_namespace(body.namespace or request.query_params.get("namespace"))
    return body


@system.post("/secrets", status_code=202)
async def create_secret(request: Request, provider: ProviderDep) -> Response:
    """Create a secret (``types.Secret``): 202 as faas-netes; 409 if it exists."""
    body = await _secret(request, provider)
    await provider.create_secret(body.name, body.data())
    return Response(status_code=202)


@system.put("/secrets", status_code=202)
async def update_secret(request: Request, provider: ProviderDep) -> Response:
    """Replace a secret's value (functions that list it see the new file): 202; 404 if unknown."""
    body = await _secret(request, provider)
    await provider.update_secret(body.name, body.data())
    return Response(status_code=202)


@system.delete("/secrets", status_code=202)
async def delete_secret(request: Request, provider: ProviderDep) -> Response:
    """Delete a secret (body ``{"name"}``): 202; 404 if unknown; 409 while a function uses it."""
    body = await _secret(request, provider)
    await provider.delete_secret(body.name)
    return Response(status_code=202)


@system.api_route("/namespace/{ns}", methods=["GET", "POST", "PUT", "DELETE"])
@system.api_route("/namespace/", methods=["POST"])  # faas-cli namespace create names it in the body
async def not_implemented() -> JSONResponse:
    """Namespace management is not provided by the embedded runtime."""
    return JSONResponse(
        {
            "error": "not_implemented",
            "detail": "Feature not implemented in this version of OpenFaaS",
        },
        status_code=501,
    )


@system.get("/logs")
async def logs(
    provider: ProviderDep,
    name: str = "",
    namespace: str | None = None,
    instance: str | None = None,
    tail: int | None = None,
    follow: bool = False,
    since: str | None = None,
) -> StreamingResponse:
    """Replica logs as ndjson ``{name, namespace, instance, timestamp, text}``."""
    if not name:
        raise InvalidRequest("name is required: GET /system/logs?name=<function>")
    fn = _name(provider, name, namespace)
    if not provider.exists(fn):
        raise FunctionNotFound(fn)
    try:
        since_dt = parse_time(since) if since else None
    except ValueError:
        raise InvalidRequest(f"since must be an RFC3339 time, got {since!r}") from None
    lines = stream_logs(
        provider.log_dir(fn),
        fn,
        provider.namespace,
        instance=instance,
        since=since_dt,
        tail=tail,
        follow=follow,
    )
    return StreamingResponse(lines, media_type="application/x-ndjson")


class _Invoke:
    """ASGI endpoint for ``/function/*`` that takes every method (405 comes from the proxy)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        state = request.app.state
        t0 = time.perf_counter()
        response = await proxy_function(
            request, state.provider, state.client, state.settings.ready_wait
        )
        try:
            await response(scope, receive, send)
        finally:  # counted once the answer is out, as the gateway counts it
            name, _ = split_namespace(request.path_params.get("name", ""))
            state.metrics.observe(
                f"{name}.{state.provider.namespace}",
                response.status_code,
                time.perf_counter() - t0,
            )


async def _metrics(request: Request) -> Response:
    """``GET /metrics``: the OpenFaaS gateway's metric names (:mod:`.metrics`); basic auth."""
    _check_auth(request)
    state = request.app.state
    return Response(state.metrics.render(state.provider), media_type=METRICS_CONTENT_TYPE)


async def _accept_async(request: Request) -> Response:
    """``/async-function/{name}[/{path}]``: 202 with ``X-Call-Id`` (see :mod:`.async_calls`)."""
    calls: AsyncCalls | None = request.app.state.async_calls
    if calls is None:
        admit(request.app.state.provider, request)  # 404 / 400 / 401 come first, as with Redis
        raise AsyncNotConfigured()
    return await calls.accept(request)


async def _healthz(request: Request) -> Response:
    return Response(status_code=200)


def create_app(settings: RuntimeSettings | None = None) -> FastAPI:
    """Build the runtime app; the Provider and its replicas live for the app's lifespan.

    Parameters
    ----------
    settings:
        Runtime settings; read from ``FEDFAAS_RUNTIME_*`` when omitted.

    Raises
    ------
    ValueError
        ``settings.auth_dir`` lacks ``basic-auth-user`` or ``basic-auth-password`` (basic auth
        on ``/system/*`` is never off).
    AuthConfigError
        ``settings.redis_url`` is set and ``settings.redis_credentials_file`` is missing or
        malformed.
    """
    settings = settings or RuntimeSettings()  # type: ignore[call-arg]  # auth_dir from the env
    auth = BasicAuth.from_dir(settings.auth_dir)
    if settings.redis_url:  # a missing or malformed credentials file stops the start here
        read_credentials(settings.redis_credentials_file, "Redis")
    settings.function_tls()  # replicas' TLS files that cannot work stop the start here too

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        provider = Provider(settings)
        client = make_client(settings.upstream_timeout, settings.replica_verify())
        await provider.start()
        calls: AsyncCalls | None = None
        if settings.redis_url:
            redis = async_redis_client(
                settings.redis_url, settings.redis_credentials_file, socket_connect_timeout=5
            )
            calls = AsyncCalls(redis, provider, client, settings)
            await calls.start()
        app.state.provider, app.state.client, app.state.async_calls = provider, client, calls
        log.info("runtime ready (basic auth user %s, stack %s)", auth.user, settings.stack)
        try:
            yield
        finally:
            if calls is not None:
                await calls.stop()
            await provider.stop()
            await client.aclose()

    app = private_app("FedFaaS runtime", version=VERSION, lifespan=lifespan)
    app.state.settings, app.state.auth, app.state.async_calls = settings, auth, None
    app.state.metrics = GatewayMetrics()
    app.include_router(system)
    app.router.routes.append(Route("/healthz", _healthz, methods=["GET", "HEAD"]))
    app.router.routes.append(Route("/metrics", _metrics, methods=["GET"]))
    app.router.routes.append(Route("/function/{name}", _Invoke()))
    app.router.routes.append(Route("/function/{name}/{path:path}", _Invoke()))
    methods = sorted(ALLOWED_METHODS)
    app.router.routes.append(Route("/async-function/{name}", _accept_async, methods=methods))
    app.router.routes.append(
        Route("/async-function/{name}/{path:path}", _accept_async, methods=methods)
    )

    @app.exception_handler(FaasRuntimeError)
    async def runtime_error(request: Request, exc: FaasRuntimeError) -> JSONResponse:
        return JSONResponse(
            {"error": exc.code, "detail": exc.detail}, status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def bad_params(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """A path no route serves (404) or a method it does not take (405), as JSON."""
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        detail = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(
            {"error": code, "detail": detail}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Unauthorized)
    async def unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
        return JSONResponse(
            {"error": exc.code, "detail": exc.detail}, status_code=exc.status, headers=REALM_HEADER
        )

    return app


__all__ = ["create_app"]

"""``/function/{name}[/...]``: stream a request to a ready replica and its response back.

Bodies are streamed both ways (never held whole in the runtime), binary intact. Headers as the
OpenFaaS gateway and provider set them: ``X-Call-Id`` and ``X-Start-Time`` on request and response,
``X-Forwarded-For``/``X-Forwarded-Host`` unless present, hop-by-hop headers dropped, the path with
``/function/<name>`` stripped and the query kept.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from fedfaas.runtime.provider import Provider
from fedfaas.runtime.validation import split_namespace

log = logging.getLogger(__name__)

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
CONNECT_ATTEMPTS = 3


def make_client(upstream_timeout: float) -> httpx.AsyncClient:
    """An upstream client that adds no headers of its own and ignores proxy env variables."""
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(upstream_timeout, connect=5.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        trust_env=False,
        follow_redirects=False,
    )
    for key in list(client.headers.keys()):
        del client.headers[key]
    return client


class _Body:
    """The request body as an async iterator that remembers whether it was started."""

    def __init__(self, request: Request) -> None:
        self.request, self.started = request, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self.request.stream():
            if chunk:
                yield chunk


def _error(status: int, text: str) -> Response:
    return PlainTextResponse(text, status_code=status, headers={"X-OpenFaaS-Internal": "proxy"})


async def proxy_function(
    request: Request, provider: Provider, client: httpx.AsyncClient, ready_wait: float
) -> Response:
    """Invoke function ``request.path_params['name']`` (OpenFaaS ``/function/*`` semantics)."""
    method = request.method
    if method not in ALLOWED_METHODS:
        return _error(405, f"method {method} is not allowed")
    fn, ns = split_namespace(request.path_params["name"])
    if not fn:
        return _error(400, "Provide a named function.")
    if (ns and ns != provider.namespace) or not provider.exists(fn):
        return _error(404, f"error finding function {fn}.{ns or provider.namespace}: not found")

    call_id = request.headers.get("x-call-id") or str(uuid.uuid4())
    start_ns = str(time.time_ns())
    headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP and k != "host"]
    present = {k for k, _ in headers}
    if "x-call-id" not in present:
        headers.append(("X-Call-Id", call_id))
    headers.append(("X-Start-Time", start_ns))
    if "x-forwarded-host" not in present and request.headers.get("host"):
        headers.append(("X-Forwarded-Host", request.headers["host"]))
    if "x-forwarded-for" not in present and request.client is not None:
        headers.append(("X-Forwarded-For", request.client.host))
    path = "/" + request.path_params.get("path", "")
    query = request.url.query
    body = _Body(request)
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers

    upstream: httpx.Response | None = None
    for _ in range(CONNECT_ATTEMPTS):
        replica = await provider.pick_replica(fn, ready_wait)
        if replica is None:
            return _error(503, f"No endpoints available for: {fn}.")
        url = f"{replica.url}{path}" + (f"?{query}" if query else "")
        req = client.build_request(method, url, headers=headers, content=body if has_body else None)
        try:
            upstream = await client.send(req, stream=True)
            break
        except httpx.ConnectError:
            if body.started:
                return Response(status_code=502)
            log.warning("%s refused a connection; marking it unready", replica.instance)
            if replica.state == "ready":
                replica.state = "unready"
        except httpx.HTTPError as exc:
            log.warning("invoke %s via %s failed: %r", fn, replica.instance, exc)
            return Response(status_code=502)
    if upstream is None:
        return Response(status_code=502)
    provider.count_invocation(fn)

    out = [
        (k, v)
        for k, v in upstream.headers.multi_items()
        if k.lower() not in HOP_BY_HOP and k.lower() not in ("date", "server")
    ]
    names = {k.lower() for k, _ in out}
    if "content-type" not in names:
        out.append(("content-type", request.headers.get("content-type", "text/plain")))
    if "x-call-id" not in names:
        out.append(("x-call-id", call_id))
    out.append(("x-start-time", start_ns))
    response = StreamingResponse(
        _relay(upstream, fn),
        status_code=upstream.status_code,
        background=BackgroundTask(upstream.aclose),
    )
    response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in out]
    return response


async def _relay(upstream: httpx.Response, fn: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        log.warning("response from %s broke off: %r", fn, exc)

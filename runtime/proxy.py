"""``/function/{name}[/...]``: stream a request to a ready replica and its response back.

Bodies are streamed both ways (never held whole in the runtime), binary intact. Headers as the
OpenFaaS gateway and provider set them: ``X-Call-Id`` and ``X-Start-Time`` on request and
response, ``X-Served-By`` on the response (``fedfaas-runtime/<version>``),
``X-Forwarded-For``/``X-Forwarded-Host`` unless present, hop-by-hop headers dropped, the path with
``/function/<name>`` stripped and the query kept.
"""

from __future__ import annotations

import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Send

from runtime.provider import Provider
from runtime.settings import VERSION
from runtime.validation import split_namespace

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
# the CE gateway sends ``openfaas-ce/<version>``; this names what actually served the call
SERVED_BY = f"fedfaas-runtime/{VERSION}".encode()


def make_client(upstream_timeout: float, verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """An upstream client that adds no headers of its own and ignores proxy env variables;
    ``verify``: how it checks replicas that serve HTTPS (:meth:`RuntimeSettings.replica_verify`)."""
    client = httpx.AsyncClient(
        verify=verify,
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


def end_to_end(raw: list[tuple[bytes, bytes]], *drop: bytes) -> list[tuple[bytes, bytes]]:
    """``raw`` headers without the hop-by-hop ones (those of RFC 9110 and any the ``Connection``
    header names, as Go's ReverseProxy drops them) and without ``drop`` (lower-case names).

    Works on raw bytes so that values that are not ASCII pass through unchanged.
    """
    named = {
        token.strip().lower().decode("latin-1")
        for k, v in raw
        if k.lower() == b"connection"
        for token in v.split(b",")
    }
    skip = HOP_BY_HOP | named | {d.decode("latin-1") for d in drop}
    return [(k, v) for k, v in raw if k.lower().decode("latin-1") not in skip]


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
    start_ns = str(time.time_ns()).encode()
    headers = end_to_end(request.headers.raw, b"host")
    present = {k.lower() for k, _ in headers}
    if b"x-call-id" not in present:
        headers.append((b"X-Call-Id", call_id.encode("latin-1")))
    headers.append((b"X-Start-Time", start_ns))
    if b"x-forwarded-host" not in present and "host" in request.headers:
        headers.append((b"X-Forwarded-Host", request.headers["host"].encode("latin-1")))
    if b"x-forwarded-for" not in present and request.client is not None:
        headers.append((b"X-Forwarded-For", request.client.host.encode("latin-1")))
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
        except ClientDisconnect:
            # the caller went away while sending its body; nobody is left to answer
            log.info("client left while sending its body to %s", replica.instance)
            return Response(status_code=499)
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

    out = end_to_end(upstream.headers.raw, b"date", b"server")
    names = {k.lower() for k, _ in out}
    if b"content-type" not in names:
        ctype = request.headers.get("content-type", "text/plain")
        out.append((b"content-type", ctype.encode("latin-1")))
    if b"x-call-id" not in names:
        out.append((b"x-call-id", call_id.encode("latin-1")))
    out.append((b"x-start-time", start_ns))
    out.append((b"x-served-by", SERVED_BY))
    return _Relay(upstream, fn, [(k.lower(), v) for k, v in out])


class _Relay(StreamingResponse):
    """A replica's response, streamed; the upstream response is closed when it ends, also when
    the caller disconnects (Starlette then cancels the stream and runs the background task).

    If the replica breaks off after the headers, the response is left incomplete, so that the
    server closes the connection and the caller sees an error instead of a body cut short that
    looks whole (what Go's ReverseProxy does with ``http.ErrAbortHandler``).
    """

    def __init__(
        self, upstream: httpx.Response, fn: str, raw_headers: list[tuple[bytes, bytes]]
    ) -> None:
        super().__init__(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            background=BackgroundTask(upstream.aclose),
        )
        self.raw_headers = raw_headers
        self.fn = fn

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            log.warning("response of %s broke off: %r; closing the connection", self.fn, exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

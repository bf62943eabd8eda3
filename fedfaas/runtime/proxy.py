"""``/function/{name}[/...]``: stream a request to a ready replica and its response back.

Bodies are streamed both ways (never held whole in the runtime), binary intact. Headers as the
OpenFaaS gateway and provider set them: ``X-Call-Id`` and ``X-Start-Time`` on request and
response, ``X-Served-By`` on the response (``fedfaas-runtime/<version>``),
``X-Forwarded-For``/``X-Forwarded-Host`` unless present, hop-by-hop headers dropped, the path with
``/function/<name>`` stripped and the query kept.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import multidict
import yarl
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Send

from fedfaas.runtime.provider import Provider
from fedfaas.runtime.settings import VERSION
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
# the CE gateway sends ``openfaas-ce/<version>``; this names what actually served the call
SERVED_BY = f"fedfaas-runtime/{VERSION}".encode()


def make_client(upstream_timeout: float) -> aiohttp.ClientSession:
    """An upstream client on kept-alive connections (aiohttp: a call costs about half a
    millisecond less than with httpx) that adds no headers of its own, passes bodies through
    undecoded, follows no redirect and ignores proxy env variables. Call it on the running
    loop."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=upstream_timeout),
        auto_decompress=False,
        trust_env=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )


class _Body:
    """The request body as an async iterator that remembers whether it was started, and
    whether the caller went away while sending it."""

    def __init__(self, request: Request) -> None:
        self.request, self.started, self.disconnected = request, False, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        try:
            async for chunk in self.request.stream():
                if chunk:
                    yield chunk
        except ClientDisconnect:
            self.disconnected = True
            raise


def _text(value: bytes) -> str:
    """A header value as the upstream client takes it (it writes header text as UTF-8): UTF-8
    bytes pass through unchanged; other bytes (rare: RFC 9110 calls them obsolete) are read as
    Latin-1 and so reach the function re-encoded."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


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
    request: Request, provider: Provider, client: aiohttp.ClientSession, ready_wait: float
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

    upstream: aiohttp.ClientResponse | None = None
    sent = multidict.CIMultiDict((k.decode("latin-1"), _text(v)) for k, v in headers)
    for _ in range(CONNECT_ATTEMPTS):
        replica = await provider.pick_replica(fn, ready_wait)
        if replica is None:
            return _error(503, f"No endpoints available for: {fn}.")
        url = yarl.URL(f"{replica.url}{path}" + (f"?{query}" if query else ""), encoded=True)
        try:
            upstream = await client.request(
                method,
                url,
                headers=sent,
                data=body if has_body else None,
                allow_redirects=False,
            )
            break
        except ClientDisconnect:
            # the caller went away while sending its body; nobody is left to answer
            log.info("client left while sending its body to %s", replica.instance)
            return Response(status_code=499)
        except aiohttp.ClientConnectorError:
            if body.started:
                return Response(status_code=502)
            log.warning("%s refused a connection; marking it unready", replica.instance)
            if replica.state == "ready":
                replica.state = "unready"
        except (aiohttp.ClientError, TimeoutError) as exc:
            if body.disconnected:
                log.info("client left while sending its body to %s", replica.instance)
                return Response(status_code=499)
            log.warning("invoke %s via %s failed: %r", fn, replica.instance, exc)
            return Response(status_code=502)
    if upstream is None:
        return Response(status_code=502)
    provider.count_invocation(fn)

    out = end_to_end(list(upstream.raw_headers), b"date", b"server")
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
        self, upstream: aiohttp.ClientResponse, fn: str, raw_headers: list[tuple[bytes, bytes]]
    ) -> None:
        super().__init__(
            upstream.content.iter_any(),
            status_code=upstream.status,
            background=BackgroundTask(upstream.release),
        )
        self.raw_headers = raw_headers
        self.fn = fn

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("response of %s broke off: %r; closing the connection", self.fn, exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

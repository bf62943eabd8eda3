"""Asynchronous invocations, as OpenFaaS's gateway and queue-worker do them, on a Redis stream.

``POST /async-function/{name}[/{path}]`` checks the function exists (404), its callback URL
(``X-Callback-Url``, http/https only: 400), the function token when the function requires one
(401, before the body is read) and the body's size (``async_max_body``: 413); it then appends the
call (method, path, query, headers, body, callback URL) to the stream ``runtime:async:calls``
and answers ``202 Accepted`` with ``X-Call-Id`` (the caller's, else a new one).

Workers (``async_workers`` asyncio tasks) read the stream through the consumer group
``workers``, invoke the function through :func:`~runtime.proxy.proxy_function` (the path
of ``/function/{name}``: a ready replica, waiting ``ready_wait`` for one), and POST its response
to the callback URL with ``X-Call-Id``, ``X-Function-Status``, ``X-Function-Name``,
``X-Duration-Seconds``, the function's headers (its content type) and its body.

Guarantees: a call is acknowledged (and deleted) only when its callback was delivered (any
answer but 5xx), or it has no callback and the function answered; so a call accepted by a
runtime that dies is delivered after a restart on the same Redis (a worker takes over calls
whose worker sent no heartbeat for ``async_claim_idle`` seconds). Delivery is at least once: a
runtime that dies after invoking the function but before the callback invokes it again. An
invocation that found no ready replica (or no function) and a callback that failed (connection
error, 5xx) are retried with backoff (``async_retry_backoff``, doubled, at most 60 s) up to
``async_max_attempts`` attempts; then the call is dropped with a logged error.

The stored request is JSON plus the body's raw bytes (nothing is pickled). It holds the caller's
``Authorization`` header: the function checks its token when the call is delivered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from redis.exceptions import RedisError, ResponseError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message

from runtime.errors import (
    FunctionNotFound,
    FunctionUnauthorized,
    InvalidRequest,
    PayloadTooLarge,
    QueueUnavailable,
)
from runtime.function_auth import TOKEN_SECRET, FunctionToken, NoToken
from runtime.proxy import end_to_end, proxy_function
from runtime.validation import split_namespace

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from runtime.provider import Provider
    from runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)

#: The stream of accepted calls (the runtime's Redis user reaches ``runtime:async:*`` only).
STREAM = "runtime:async:calls"
GROUP = "workers"
MAX_BACKOFF = 60.0


@dataclass(frozen=True)
class Call:
    """One accepted asynchronous call, as stored in the stream."""

    call_id: str
    function: str
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]  # latin-1 text of the raw header bytes
    callback_url: str | None
    body: bytes

    def to_fields(self) -> dict[str, bytes]:
        doc = {
            "call_id": self.call_id,
            "function": self.function,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "callback_url": self.callback_url,
        }
        return {"call": json.dumps(doc).encode(), "body": self.body}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Call:
        """Raises ``ValueError``/``KeyError``/``TypeError`` on an entry that is not a call."""
        doc = json.loads(fields[b"call"])
        return cls(
            call_id=str(doc["call_id"]),
            function=str(doc["function"]),
            method=str(doc["method"]),
            path=str(doc["path"]),
            query=str(doc["query"]),
            headers=[(str(k), str(v)) for k, v in doc["headers"]],
            callback_url=doc["callback_url"],
            body=fields.get(b"body", b""),
        )


class Retry(Exception):
    """A step of a call failed in a way that a later attempt may not (no replica, 5xx)."""


def check_callback_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host; :class:`InvalidRequest` otherwise."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise InvalidRequest(
            f"X-Callback-Url must be an absolute http:// or https:// URL, got {url!r}"
        )
    return url


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class AsyncCalls:
    """The queue of asynchronous calls and its workers (one per runtime, in the app's lifespan).

    Parameters
    ----------
    redis:
        A ``redis.asyncio`` client (bytes, not decoded) logged in as the runtime's user.
    provider, client:
        The runtime's provider and upstream client (the path of ``/function/*``).
    settings:
        ``ready_wait``, ``async_*`` and ``upstream_timeout`` (the callback's timeout).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        provider: Provider,
        client: httpx.AsyncClient,
        settings: RuntimeSettings,
    ) -> None:
        self.redis, self.provider, self.client, self.settings = redis, provider, client, settings
        self.consumer = f"runtime-{uuid.uuid4().hex[:12]}"
        self._tasks: list[asyncio.Task[None]] = []
        self._callbacks = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout, connect=5.0),
            trust_env=False,
            follow_redirects=False,
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the workers (each creates the consumer group if it is new, waiting for Redis:
        the runtime starts and serves ``/function/*`` while Redis is down)."""
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"async-worker-{i}")
            for i in range(self.settings.async_workers)
        ]
        log.info("%d async workers (consumer %s)", len(self._tasks), self.consumer)

    async def stop(self) -> None:
        """Stop the workers; calls they held stay pending, for the next runtime to deliver."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._callbacks.aclose()
        await self.redis.aclose()

    # ------------------------------------------------------------------ accept
    async def accept(self, request: Request) -> Response:
        """``/async-function/{name}[/{path}]``: check, store, answer 202 with ``X-Call-Id``."""
        fn, callback = admit(self.provider, request)
        body = await _read_body(request, self.settings.async_max_body)

        call_id = request.headers.get("x-call-id") or str(uuid.uuid4())
        raw = end_to_end(request.headers.raw, b"host", b"content-length")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
        present = {k.lower() for k, _ in headers}
        if "x-call-id" not in present:
            headers.append(("X-Call-Id", call_id))
        if "x-forwarded-host" not in present and "host" in request.headers:
            headers.append(("X-Forwarded-Host", request.headers["host"]))
        if "x-forwarded-for" not in present and request.client is not None:
            headers.append(("X-Forwarded-For", request.client.host))
        call = Call(
            call_id=call_id,
            function=fn,
            method=request.method,
            path=request.path_params.get("path", ""),
            query=request.url.query,
            headers=headers,
            callback_url=callback,
            body=body,
        )
        try:
            await self.redis.xadd(STREAM, call.to_fields())  # type: ignore[arg-type]
        except RedisError as exc:
            log.error("async call %s to %s not accepted: %r", call_id, fn, exc)
            raise QueueUnavailable(
                f"the queue of asynchronous calls (Redis) cannot be reached: {exc}"
            ) from None
        log.info("accepted async call %s to %s (%d bytes)", call_id, fn, len(body))
        return Response(status_code=202, headers={"X-Call-Id": call_id})

    # ------------------------------------------------------------------ workers
    async def _create_group(self) -> None:
        try:
            await self.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _worker(self, index: int) -> None:
        idle_ms = int(self.settings.async_claim_idle * 1000)
        ready = False
        while True:
            try:
                if not ready:
                    await self._create_group()
                    ready = True
                entry = await self._next(idle_ms)
                if entry is not None:
                    await self._handle(*entry)
            except asyncio.CancelledError:
                raise
            except RedisError as exc:  # Redis down for a while: wait, go on
                log.warning("async worker %d: Redis unavailable (%r); retrying in 1s", index, exc)
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("async worker %d failed; retrying in 1s", index)
                await asyncio.sleep(1.0)

    async def _next(self, idle_ms: int) -> tuple[bytes, dict[bytes, bytes]] | None:
        """A call another worker held without heartbeats for ``idle_ms``, else a new one."""
        claimed: Any = await self.redis.xautoclaim(
            STREAM, GROUP, self.consumer, min_idle_time=idle_ms, start_id="0-0", count=1
        )
        for entry_id, fields in claimed[1]:
            if fields:
                log.info("took over async call %s", entry_id.decode())
                return entry_id, fields
        got: Any = await self.redis.xreadgroup(
            GROUP, self.consumer, {STREAM: ">"}, count=1, block=1000
        )
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                return entry_id, fields
        return None

    async def _heartbeat(self, entry_id: bytes) -> None:
        """Keep ``entry_id`` ours: re-claiming it resets its idle time."""
        every = max(0.1, self.settings.async_claim_idle / 3)
        while True:
            await asyncio.sleep(every)
            await self.redis.xclaim(STREAM, GROUP, self.consumer, 0, [entry_id], justid=True)

    async def _handle(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            call = Call.from_fields(fields)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("dropping async entry %s: not a call (%r)", entry_id.decode(), exc)
            await self._ack(entry_id)
            return
        beat = asyncio.create_task(self._heartbeat(entry_id))
        try:
            await self._run(call)
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
        await self._ack(entry_id)

    async def _ack(self, entry_id: bytes) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(STREAM, GROUP, entry_id)
            pipe.xdel(STREAM, entry_id)
            await pipe.execute()

    async def _run(self, call: Call) -> None:
        """Invoke ``call`` and deliver its callback, retrying as the module docstring says."""
        result: tuple[int, list[tuple[bytes, bytes]], bytes, float] | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                if result is None:  # a failed callback is retried without a second invocation
                    result = await self._invoke(call)
                if call.callback_url:
                    await self._deliver(call, *result)
                return
            except Retry as exc:
                if attempt >= self.settings.async_max_attempts:
                    log.error(
                        "async call %s to %s dropped after %d attempts: %s",
                        call.call_id,
                        call.function,
                        attempt,
                        exc,
                    )
                    return
                delay = min(MAX_BACKOFF, self.settings.async_retry_backoff * 2 ** (attempt - 1))
                log.warning(
                    "async call %s attempt %d failed (%s); retrying in %.1fs",
                    call.call_id,
                    attempt,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _invoke(self, call: Call) -> tuple[int, list[tuple[bytes, bytes]], bytes, float]:
        """``(status, headers, body, seconds)`` of the function; :class:`Retry` when the
        runtime, not the function, answered (no such function, no ready replica, 502)."""
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in call.headers]
        headers.append((b"content-length", str(len(call.body)).encode()))
        path = f"/function/{call.function}/{call.path}"
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": call.method,
            "scheme": "http",
            "server": (self.settings.host, self.settings.port),
            "client": None,
            "root_path": "",
            "path": path,
            "raw_path": path.encode(),
            "query_string": call.query.encode("latin-1"),
            "headers": headers,
            "path_params": {"name": call.function, "path": call.path},
        }
        sent = False

        async def receive() -> Message:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": call.body, "more_body": False}

        start = time.monotonic()
        response = await proxy_function(
            Request(scope, receive), self.provider, self.client, self.settings.ready_wait
        )
        if not isinstance(response, StreamingResponse):
            text = bytes(response.body).decode("utf-8", "replace")
            raise Retry(f"the runtime answered {response.status_code}: {text}")
        chunks: list[bytes] = []
        try:
            async for chunk in response.body_iterator:
                chunks.append(chunk if isinstance(chunk, bytes) else str(chunk).encode())
        except httpx.HTTPError as exc:
            raise Retry(f"the response of {call.function} broke off: {exc!r}") from None
        finally:
            if response.background is not None:
                await response.background()
        seconds = time.monotonic() - start
        log.info("async call %s: %s answered %d", call.call_id, call.function, response.status_code)
        return response.status_code, list(response.raw_headers), b"".join(chunks), seconds

    async def _deliver(
        self,
        call: Call,
        status: int,
        fn_headers: list[tuple[bytes, bytes]],
        body: bytes,
        seconds: float,
    ) -> None:
        """POST the result to the callback URL; :class:`Retry` on a connection error or 5xx."""
        assert call.callback_url is not None
        skip = {b"content-length", b"x-call-id", b"x-function-status", b"x-function-name"}
        headers = [(k, v) for k, v in fn_headers if k.lower() not in skip]
        if not any(k.lower() == b"x-duration-seconds" for k, _ in headers):
            headers.append((b"X-Duration-Seconds", f"{seconds:f}".encode()))
        headers += [
            (b"X-Call-Id", call.call_id.encode("latin-1")),
            (b"X-Function-Status", str(status).encode()),
            (b"X-Function-Name", call.function.encode()),
        ]
        try:
            r = await self._callbacks.post(call.callback_url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise Retry(f"callback {call.callback_url} failed: {exc!r}") from None
        if r.status_code >= 500:
            raise Retry(f"callback {call.callback_url} answered {r.status_code}")
        if r.status_code >= 400:
            log.error(
                "callback %s refused async call %s with %d; not retried",
                call.callback_url,
                call.call_id,
                r.status_code,
            )
        else:
            log.info("async call %s delivered to %s", call.call_id, call.callback_url)


__all__ = ["STREAM", "AsyncCalls", "Call", "check_callback_url"]


def admit(provider: Provider, request: Request) -> tuple[str, str | None]:
    """The checks of an asynchronous call before its body is read, Redis or not: the function
    exists (404), the callback URL is http(s) (400), and a function that lists the token secret
    gets no call without its token (401; the function checks again on delivery). Returns the
    function's name and the callback URL."""
    fn, ns = split_namespace(request.path_params["name"])
    if not fn or (ns and ns != provider.namespace) or not provider.exists(fn):
        raise FunctionNotFound(fn or request.path_params["name"])
    callback = request.headers.get("x-callback-url")
    if callback is not None:
        check_callback_url(callback)
    if TOKEN_SECRET in (provider.status(fn).get("secrets") or []):
        token = FunctionToken(provider.secrets_dir(fn) / TOKEN_SECRET)
        try:
            why = token.refusal(request.headers.get("authorization", "").encode("latin-1"))
        except NoToken as exc:
            raise FunctionUnauthorized(str(exc)) from None
        if why is not None:
            raise FunctionUnauthorized(why)
    return fn, callback

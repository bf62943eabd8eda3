"""A small HTTP/1.1 server whose upload path receives straight into shared memory.

uvicorn hands request bodies to the app as ``bytes`` chunks (a kernel -> bytes copy, then a
bytes -> destination copy, plus per-chunk Python work); at 44.8 MB that caps ingest near
0.7 GB/s. This server is an :class:`asyncio.BufferedProtocol`: for an upload the transport
``recv_into``s the exact destination span of the store object that the wire decoder hands out,
so an F32 update crosses from the socket into /dev/shm in one copy (the kernel's).

Every request that is not a native :class:`Exchange` (the control routes) is collected in full
and run through a plain ASGI call into the FastAPI app (``AsgiExchange``), so those routes keep
FastAPI's routing, models and dependency injection.

Supported: HTTP/1.0 and 1.1, keep-alive, ``Content-Length`` bodies, ``Expect: 100-continue``.
Refused with a clear status: chunked request bodies (411), heads over 16 KiB (431).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.errors import GatewayError

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
HEAD_BUF = 64 * 1024
DRAIN_LIMIT = 256 << 20
LINGER_S = 2.0
_REASONS = {
    100: "Continue",
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    304: "Not Modified",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    422: "Unprocessable Content",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass
class Request:
    """A parsed request head. Header names are lower-case; values are latin-1 strings."""

    method: str
    target: str
    path: str
    query: str
    version: str
    headers: list[tuple[str, str]]
    content_length: int | None
    keep_alive: bool
    peer: tuple[str, int] | None = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(
        cls, status: int, obj: object, headers: list[tuple[str, str]] | None = None
    ) -> Response:
        return cls(
            status,
            json.dumps(obj).encode(),
            [("content-type", "application/json"), *(headers or [])],
        )

    @classmethod
    def error(cls, exc: GatewayError) -> Response:
        return cls.json(exc.status, exc.body())


class Deferred(Exception):
    """Raised by :meth:`Exchange.start` to wait (reading paused) until ``future`` is done.

    Used for admission control: the body stays in the client's socket buffers (TCP
    back-pressure) instead of in memory, and ``start`` is called again afterwards.
    """

    def __init__(self, future: asyncio.Future[None]) -> None:
        super().__init__("deferred")
        self.future = future


class Exchange:
    """One request/response. Subclasses receive the body through ``get_buffer``/``buffer_updated``.

    ``start`` runs before any body byte is read (raise :class:`GatewayError` to refuse);
    ``complete`` runs once all ``Content-Length`` bytes arrived; ``abort`` frees resources
    when the exchange fails or the connection drops.
    """

    def start(self) -> None:
        return None

    def get_buffer(self) -> memoryview:
        raise NotImplementedError

    def buffer_updated(self, n: int) -> None:
        raise NotImplementedError

    async def complete(self) -> Response:
        raise NotImplementedError

    def abort(self) -> None:
        return None


Router = Callable[[Request], Exchange]


class _Conn(asyncio.BufferedProtocol):
    HEAD, BODY, WAIT, DRAIN, CLOSED = range(5)

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.state = self.HEAD
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        self.scratch = bytearray(1 << 20)
        self.req: Request | None = None
        self.ex: Exchange | None = None
        self.remaining = 0
        self.after_drain: Response | None = None
        self.close_after = False
        self.task: asyncio.Task[None] | None = None
        self.peer: tuple[str, int] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- transport callbacks ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self.server.conns.add(self)
        self.last_rx = time.monotonic()

    def idle_for(self, now: float) -> float | None:
        """Seconds since the last byte while a request is incomplete (None when waiting is fine)."""
        if self.state in (self.BODY, self.DRAIN) or (self.state == self.HEAD and self.hfill):
            return now - self.last_rx
        if self.state == self.HEAD:
            return (now - self.last_rx) / 4  # idle keep-alive connections get 4x longer
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)
        if self.ex is not None and self.state in (self.BODY, self.HEAD):
            self._abort()
        self.state = self.CLOSED
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.state == self.BODY:
            assert self.ex is not None
            try:
                b = self.ex.get_buffer()
            except GatewayError as exc:
                return self._fail_body(exc)
            return b[: self.remaining] if len(b) > self.remaining else b
        if self.state == self.DRAIN:
            return memoryview(self.scratch)[: min(len(self.scratch), max(self.remaining, 1))]
        if self.state == self.HEAD and self.hfill < len(self.head):
            return memoryview(self.head)[self.hfill :]
        # WAIT (pipelined bytes while a response is pending): keep them after the head buffer
        self.head.extend(bytes(65536))
        return memoryview(self.head)[self.hfill :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_rx = time.monotonic()
        if self.state == self.BODY:
            self.remaining -= nbytes
            assert self.ex is not None
            try:
                self.ex.buffer_updated(nbytes)
            except GatewayError as exc:
                self._fail_body(exc)
                return
            if self.remaining == 0:
                self._complete()
        elif self.state == self.DRAIN:
            self.remaining -= nbytes
            if self.remaining <= 0:
                self._drained()
        elif self.state in (self.HEAD, self.WAIT):
            self.hfill += nbytes
            if self.state == self.HEAD:
                self._parse_head()

    def eof_received(self) -> bool | None:
        if self.state == self.BODY:
            self._abort()
            self._respond(
                Response.json(
                    400,
                    {
                        "error": "truncated_body",
                        "detail": f"connection closed with {self.remaining} body bytes missing of Content-Length",
                    },
                ),
                close=True,
            )
        return None

    # -- request flow ----------------------------------------------------------------------------
    def _parse_head(self) -> None:
        end = self.head.find(b"\r\n\r\n", 0, self.hfill)
        if end < 0:
            if self.hfill >= MAX_HEAD:
                self._respond(
                    Response.json(
                        431,
                        {
                            "error": "head_too_large",
                            "detail": f"request line and headers must fit in {MAX_HEAD} bytes",
                        },
                    ),
                    close=True,
                )
            return
        raw = bytes(self.head[:end])
        rest = bytes(self.head[end + 4 : self.hfill])
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        try:
            req = _parse(raw, self.peer)
        except GatewayError as exc:
            self._respond(Response.error(exc), close=True)
            return
        self.req = req
        self.close_after = not req.keep_alive
        self._begin(rest)

    def _begin(self, rest: bytes) -> None:
        req = self.req
        assert req is not None
        try:
            self.ex = self.server.route(req)
            self.ex.start()
        except Deferred as d:
            self.ex = None
            self.state = self.WAIT
            if self.transport is not None:
                self.transport.pause_reading()
            d.future.add_done_callback(lambda _f: self._resume_begin(rest))
            return
        except GatewayError as exc:
            self.ex = None
            self._refuse(exc, rest)
            return
        if (req.header("expect") or "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.remaining = req.content_length or 0
        self.state = self.BODY
        if self.remaining == 0:
            self._complete()
        self._feed(rest)

    def _resume_begin(self, rest: bytes) -> None:
        if self.state == self.CLOSED or self.transport is None:
            return
        pending = bytes(self.head[: self.hfill])  # bytes that arrived while paused
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        self.transport.resume_reading()
        self._begin(rest + pending)

    def _feed(self, data: bytes) -> None:
        """Push bytes that arrived with the head through the normal receive path."""
        pos = 0
        while pos < len(data) and self.state in (self.BODY, self.DRAIN, self.HEAD, self.WAIT):
            b = self.get_buffer(len(data) - pos)
            n = min(len(b), len(data) - pos)
            b[:n] = data[pos : pos + n]
            pos += n
            self.buffer_updated(n)

    def _refuse(self, exc: GatewayError, rest: bytes) -> None:
        """Answer before reading the body; drain a bounded body to keep the connection."""
        assert self.req is not None
        n = self.req.content_length or 0
        if (
            n > DRAIN_LIMIT
            or self.req.content_length is None
            and self.req.method in ("POST", "PUT")
        ):
            self._respond(Response.error(exc), close=True, linger=True)
            return
        self.after_drain = Response.error(exc)
        self.remaining = n
        self.state = self.DRAIN
        if n == 0:
            self._drained()
        self._feed(rest)

    def _fail_body(self, exc: GatewayError) -> memoryview:
        """The body is bad: free what the exchange holds, read the rest away, then answer."""
        self._abort()
        self.after_drain = Response.error(exc)
        self.state = self.DRAIN
        if self.remaining <= 0:
            self._drained()
        return memoryview(self.scratch)[: max(1, min(len(self.scratch), self.remaining))]

    def _drained(self) -> None:
        resp, self.after_drain = self.after_drain, None
        self.state = self.WAIT
        if resp is not None:
            self._respond(resp, close=self.close_after)

    def _abort(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            try:
                ex.abort()
            except Exception:
                log.exception("exchange abort failed")

    def _complete(self) -> None:
        self.state = self.WAIT
        assert self.transport is not None
        self.transport.pause_reading()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        ex = self.ex
        assert ex is not None
        try:
            resp = await ex.complete()
        except GatewayError as exc:
            ex.abort()
            resp = Response.error(exc)
        except Exception as exc:
            log.exception("request failed")
            ex.abort()
            resp = Response.json(
                500, {"error": "internal", "detail": f"{type(exc).__name__}: {exc}"}
            )
        self.ex = None
        if self.state == self.CLOSED:
            return
        self._respond(resp, close=self.close_after)
        if self._paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
            self._drain_waiter = None

    def _respond(self, resp: Response, *, close: bool, linger: bool = False) -> None:
        t = self.transport
        if t is None or self.state == self.CLOSED:
            return
        hdrs = [(k, v) for k, v in resp.headers]
        lines = [f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in hdrs]
        if resp.status not in (204, 304) and not any(k == "content-length" for k, _ in hdrs):
            lines.append(f"content-length: {len(resp.body)}")
        if close:
            lines.append("connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if resp.body and (self.req is None or self.req.method != "HEAD"):
            t.writelines([head, resp.body])
        else:
            t.write(head)
        if close:
            self.state = self.CLOSED
            if linger and t.can_write_eof():
                # read and discard what the client still sends so it sees our answer, not a reset
                t.write_eof()
                self.state = self.DRAIN
                self.remaining = DRAIN_LIMIT
                self.after_drain = None
                asyncio.get_running_loop().call_later(LINGER_S, t.close)
            else:
                t.close()
            return
        self.state = self.HEAD
        self.req = None
        pending = bytes(self.head[: self.hfill])
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        t.resume_reading()
        if pending:
            self._feed(pending)


def _parse(raw: bytes, peer: tuple[str, int] | None) -> Request:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes anything
        raise GatewayError("request head is not latin-1") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise GatewayError(f"malformed request line {lines[0][:80]!r}", code="bad_request")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise GatewayError(
            f"unsupported HTTP version {version[:20]!r}", status=505, code="http_version"
        )
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name or "\t" in name:
            raise GatewayError(f"malformed header line {line[:80]!r}", code="bad_header")
        headers.append((name.lower(), value.strip(" \t")))
    lengths = {v for k, v in headers if k == "content-length"}
    if any(k == "transfer-encoding" for k, _ in headers):
        raise GatewayError(
            "chunked or encoded request bodies are not supported: send Content-Length",
            status=411,
            code="length_required",
        )
    if len(lengths) > 1:
        raise GatewayError("conflicting Content-Length headers", code="bad_content_length")
    length: int | None = None
    if lengths:
        v = lengths.pop()
        if not v.isdigit() or len(v) > 18:
            raise GatewayError(
                f"Content-Length {v[:30]!r} is not a non-negative integer",
                code="bad_content_length",
            )
        length = int(v)
    conn = next((v.lower() for k, v in headers if k == "connection"), "")
    keep = ("close" not in conn) if version == "HTTP/1.1" else ("keep-alive" in conn)
    path, _, query = target.partition("?")
    return Request(method, target, path, query, version[5:], headers, length, keep, peer)


class HttpServer:
    """Listens on ``host:port``; ``route(request)`` picks the :class:`Exchange` per request."""

    def __init__(self, route: Router, read_timeout: float = 60.0) -> None:
        self.route = route
        self.read_timeout = read_timeout
        self.conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Conn(self), host, port, reuse_address=True, backlog=512
        )
        sock = self._server.sockets[0]
        self._reaper = loop.create_task(self._reap())
        return int(sock.getsockname()[1])

    async def _reap(self) -> None:
        """Close connections stalled mid-request (slow or dead clients hold store buffers)."""
        while True:
            await asyncio.sleep(min(5.0, self.read_timeout / 4))
            now = time.monotonic()
            for c in list(self.conns):
                idle = c.idle_for(now)
                if idle is not None and idle > self.read_timeout and c.transport is not None:
                    log.info("closing connection from %s: no data for %.0fs", c.peer, idle)
                    c.transport.close()  # connection_lost aborts the exchange and frees its object

    async def stop(self) -> None:
        if self._server is None:
            return
        if self._reaper is not None:
            self._reaper.cancel()
        self._server.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None


Handler = Callable[[Request], Awaitable[Response]]

"""A small HTTP/1.1 server whose upload path receives straight into shared memory.

uvicorn hands request bodies to the app as ``bytes`` chunks (a kernel -> bytes copy, then a
bytes -> destination copy, plus per-chunk Python work); at 44.8 MB that caps ingest near
0.7 GB/s. This server is an :class:`asyncio.BufferedProtocol`: for an upload the transport
``recv_into``s the exact destination span of the store object that the wire decoder hands out,
so an F32 update crosses from the socket into /dev/shm in one copy (the kernel's).

Every request that is not a native :class:`Exchange` (the control routes) goes through a plain
ASGI call into the FastAPI app (``AsgiExchange``), so those routes keep FastAPI's routing,
models and dependency injection. Those exchanges are *on demand*: the app runs before any body
byte is read, and a route reads its (bounded) body only after it has authenticated the request.

No body byte is read before the request is routed and accepted. A refused request (or one whose
route answered without its body) is answered at once; its body is then read away into one
shared scratch buffer to keep the connection (up to ``DRAIN_LIMIT``), or the connection is
closed after the answer (larger bodies, ``Expect: 100-continue``). An exception an exchange
raises outside a :class:`GatewayError` (a bug, an OS failure) is logged and answered 500 the
same way: never by closing the connection without an answer.

With an :class:`ssl.SSLContext` (the gateway's ``tls_*`` settings) the port is TLS only
(:class:`core.tls_front.TlsFront`): the event loop's TLS layer decrypts into the same
destination spans (not one copy then: the record layer's buffers and the decryption add
theirs); a plain-HTTP request is answered 400 ``tls_required``. Each request carries its
connection's client certificate, as the CA verified it in the handshake (``Request.client_cert``;
the gateway's internal routes need one, :mod:`gateway.callers`).

Supported: HTTP/1.0 and 1.1, keep-alive, ``Content-Length`` bodies, ``Expect: 100-continue``.
Refused with a clear status: chunked request bodies (411), heads over 16 KiB (431).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from typing import Any

from core.tls_front import TlsFront
from gateway.errors import GatewayError
from gateway.exchange import REASONS, Deferred, Exchange, Request, Response, Router, parse_head

__all__ = ["Deferred", "Exchange", "HttpServer", "Request", "Response", "Router"]

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
HEAD_BUF = 64 * 1024
DRAIN_LIMIT = 256 << 20
LINGER_S = 2.0


class _Conn(asyncio.BufferedProtocol):
    HEAD, BODY, WAIT, DRAIN, CLOSED = range(5)

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.state = self.HEAD
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        self.req: Request | None = None
        self.ex: Exchange | None = None
        self.remaining = 0
        self.after_drain: Response | None = None
        self.close_after = False
        self.task: asyncio.Task[None] | None = None
        self.peer: tuple[str, int] | None = None
        self.tls = False
        self.client_cert: dict[str, Any] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.pending = b""  # bytes after the head that an on-demand exchange has not read yet
        self.body_unread = False  # the on-demand exchange has not asked for its body (yet)
        self.app_running = False  # the exchange's complete() has not returned yet
        self.continued = False  # "100 Continue" was sent for this request
        self._body_done: asyncio.Future[None] | None = None  # an on-demand body being read

    # -- transport callbacks ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        # over TLS the handshake is done here; a client certificate is one the CA verified
        self.tls = transport.get_extra_info("sslcontext") is not None
        cert = transport.get_extra_info("peercert") if self.tls else None
        self.client_cert = cert if isinstance(cert, dict) and cert else None
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
        done, self._body_done = self._body_done, None
        if done is not None and not done.done():
            # the on-demand exchange is waiting for its body: it aborts itself
            done.set_exception(ConnectionResetError("the client closed the connection mid-body"))
        elif self.ex is not None and not self.app_running and self.state in (self.BODY, self.HEAD):
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
            except Exception as exc:
                return self._fail_body(self._internal(exc, "receiving its body"))
            return b[: self.remaining] if len(b) > self.remaining else b
        if self.state == self.DRAIN:
            scratch = self.server.scratch
            return memoryview(scratch)[: min(len(scratch), max(self.remaining, 1))]
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
            except Exception as exc:
                self._fail_body(self._internal(exc, "receiving its body"))
                return
            if self.remaining == 0:
                if self._body_done is not None:
                    self._body_received()
                else:
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
        if self.state != self.BODY:
            return None
        err = GatewayError(
            f"connection closed with {self.remaining} body bytes missing of Content-Length",
            code="truncated_body",
        )
        done, self._body_done = self._body_done, None
        if done is not None:  # the on-demand exchange answers; then the connection closes
            self.close_after = True
            self.state = self.WAIT
            done.set_exception(err)
            return True
        self._abort()
        self._respond(Response.error(err), close=True)
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
            req = parse_head(raw, self.peer)
        except GatewayError as exc:
            self._respond(Response.error(exc), close=True)
            return
        req.tls, req.client_cert = self.tls, self.client_cert
        self.req = req
        self.close_after = not req.keep_alive
        self.continued = False
        self._begin(rest)

    def _begin(self, rest: bytes) -> None:
        req = self.req
        assert req is not None
        self.remaining = req.content_length or 0
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
            self._answer_early(Response.error(exc), rest)
            return
        except Exception as exc:  # answered like any refusal, never a silent disconnect
            err = self._internal(exc, "before its body")
            self._abort()
            self._answer_early(Response.error(err), rest)
            return
        if self.ex.on_demand:  # its complete() runs now and asks for the body if it wants it
            self.ex.receive_body = self._receive_body
            self.pending = rest
            self.body_unread = True
            self._complete()
            return
        self._continue()
        self.state = self.BODY
        if self.remaining == 0:
            self._complete()
        self._feed(rest)

    def _continue(self) -> None:
        req = self.req
        assert req is not None
        if (req.header("expect") or "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.continued = True

    def _resume_begin(self, rest: bytes) -> None:
        if self.state == self.CLOSED or self.transport is None:
            return
        pending = self._take_pending()  # bytes that arrived while paused
        self.transport.resume_reading()
        self._begin(rest + pending)

    def _take_pending(self) -> bytes:
        data = self.pending + bytes(self.head[: self.hfill])
        self.pending = b""
        self.head = bytearray(HEAD_BUF)
        self.hfill = 0
        return data

    def _feed(self, data: bytes) -> None:
        """Push bytes that arrived with the head through the normal receive path."""
        pos = 0
        while pos < len(data) and self.state in (self.BODY, self.DRAIN, self.HEAD, self.WAIT):
            b = self.get_buffer(len(data) - pos)
            n = min(len(b), len(data) - pos)
            b[:n] = data[pos : pos + n]
            pos += n
            self.buffer_updated(n)

    async def _receive_body(self) -> None:
        """``Exchange.receive_body`` of an on-demand exchange: read its body now."""
        if not self.body_unread:
            raise RuntimeError("receive_body() may be awaited once per request")
        self.body_unread = False
        if self.state == self.CLOSED or self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        if self.remaining == 0:
            return
        done = asyncio.get_running_loop().create_future()
        self._body_done = done
        self._continue()
        self.state = self.BODY
        data = self._take_pending()
        self.transport.resume_reading()
        self._feed(data)
        await done

    def _body_received(self) -> None:
        done, self._body_done = self._body_done, None
        self.state = self.WAIT
        if self.transport is not None:
            self.transport.pause_reading()
        if done is not None and not done.done():
            done.set_result(None)

    def _answer_early(self, resp: Response, data: bytes) -> None:
        """Answer before the body (``remaining`` bytes, ``data`` of them here) is read.

        The body is then read away into the scratch buffer to keep the connection, or, when it
        is large or the client waits for "100 Continue" before sending it, the connection is
        closed after the answer (lingering a moment so the client reads it, not a reset).
        """
        req = self.req
        assert req is not None
        self.body_unread = False
        no_length = req.content_length is None and req.method in ("POST", "PUT")
        waits = (req.header("expect") or "").lower() == "100-continue" and not self.continued
        if self.remaining <= 0 and not no_length:
            self.state = self.WAIT
            self.pending = data
            self._respond(resp, close=self.close_after)
        elif no_length or waits or self.remaining > DRAIN_LIMIT:
            self._respond(resp, close=True, linger=True)
        else:
            self._write(resp, close=self.close_after)
            self.after_drain = None
            self.state = self.DRAIN
            if self.transport is not None:
                self.transport.resume_reading()
            self._feed(data)

    def _fail_body(self, exc: GatewayError) -> memoryview:
        """The body is bad: free what the exchange holds, read the rest away, then answer."""
        done, self._body_done = self._body_done, None
        self.state = self.DRAIN
        if done is not None:  # on demand: the exchange answers (at once; see _run)
            done.set_exception(exc)
        else:
            self._abort()
            self.after_drain = Response.error(exc)
        if self.remaining <= 0:
            self._drained()
        scratch = self.server.scratch
        return memoryview(scratch)[: max(1, min(len(scratch), self.remaining))]

    def _drained(self) -> None:
        resp, self.after_drain = self.after_drain, None
        if resp is not None:
            self.state = self.WAIT
            self._respond(resp, close=self.close_after)
        elif self.app_running:  # an on-demand exchange still composes its answer
            self.state = self.WAIT
            if self.transport is not None:
                self.transport.pause_reading()
        elif self.close_after:
            self.state = self.CLOSED
            if self.transport is not None:
                self.transport.close()
        else:
            self._next_request()

    def _internal(self, exc: Exception, when: str) -> GatewayError:
        """A 500 for an exception no route turned into an answer, logged with its traceback.

        It must not escape a transport callback: the event loop would close the connection
        without an answer (and log nothing at all for an ``OSError``).
        """
        req = self.req
        what = f"{req.method} {req.path}" if req is not None else "a request"
        log.error("%s failed %s", what, when, exc_info=exc)
        return GatewayError(f"{type(exc).__name__}: {exc}", status=500, code="internal")

    def _abort(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            try:
                ex.abort()
            except Exception:
                log.exception("exchange abort failed")

    def _complete(self) -> None:
        self.state = self.WAIT
        self.app_running = True
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
            if self.state != self.CLOSED:  # else the client left mid-body: nobody to tell
                log.exception("request failed")
            ex.abort()
            resp = Response.json(
                500, {"error": "internal", "detail": f"{type(exc).__name__}: {exc}"}
            )
        self.ex = None
        self.app_running = False
        if self.state == self.CLOSED:
            return
        if self.state == self.DRAIN:  # its body failed part way: answer now, read the rest away
            self._answer_early(resp, b"")
        elif self.body_unread:  # answered without reading the body
            self._answer_early(resp, self._take_pending())
        else:
            self._respond(resp, close=self.close_after)
        if self._paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter
            self._drain_waiter = None

    def _write(self, resp: Response, *, close: bool) -> None:
        t = self.transport
        assert t is not None
        hdrs = [(k, v) for k, v in resp.headers]
        lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Status')}"]
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

    def _respond(self, resp: Response, *, close: bool, linger: bool = False) -> None:
        t = self.transport
        if t is None or self.state == self.CLOSED:
            return
        self._write(resp, close=close)
        if close:
            self.state = self.CLOSED
            if linger and t.can_write_eof():
                # read and discard what the client still sends so it sees our answer, not a reset
                t.write_eof()
                self.state = self.DRAIN
                self.remaining = DRAIN_LIMIT
                self.after_drain = None
                self.close_after = True
                t.resume_reading()
                asyncio.get_running_loop().call_later(LINGER_S, t.close)
            else:
                t.close()
            return
        self._next_request()

    def _next_request(self) -> None:
        t = self.transport
        assert t is not None
        self.state = self.HEAD
        self.req = None
        pending = self._take_pending()
        t.resume_reading()
        if pending:
            self._feed(pending)


class HttpServer:
    """Listens on ``host:port``; ``route(request)`` picks the :class:`Exchange` per request."""

    def __init__(
        self, route: Router, read_timeout: float = 60.0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.route = route
        self.read_timeout = read_timeout
        self.conns: set[_Conn] = set()
        #: where refused or unread bodies are read away (contents discarded: one for all)
        self.scratch = bytearray(1 << 20)
        self._server: asyncio.base_events.Server | None = None
        self._reaper: asyncio.Task[None] | None = None
        #: with a context, every connection is TLS (:class:`core.tls_front.TlsFront`)
        self.tls = tls
        self._front: TlsFront | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._reaper = loop.create_task(self._reap())
        if self.tls is not None:
            self._front = TlsFront(lambda: _Conn(self), self.tls, self.read_timeout)
            return await self._front.start(host, port)
        self._server = await loop.create_server(
            lambda: _Conn(self), host, port, reuse_address=True, backlog=512
        )
        sock = self._server.sockets[0]
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
        if self._front is not None:
            await self._front.stop()
            self._front = None
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self._server is None:
            for c in list(self.conns):
                if c.transport is not None:
                    c.transport.close()
            return
        self._server.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None

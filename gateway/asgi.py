"""Run one request through an ASGI app (the FastAPI control routes), reading its body on demand.

The app runs before any body byte is read. A route reads its body by awaiting it (FastAPI's
``request.body()``, after its authentication check): the first ``receive()`` reads it then,
bounded by ``max_body`` (413) and held against the node's :class:`MemoryBudget` (503). A route
that wants a large body outside the heap (the job-creation body) calls :func:`receive_into`
instead: the transport receives straight into the route's buffer, taking the budget span by
span as bytes arrive. A route that never asks never has its body read (``gateway.http``).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

from gateway.bodies import Hold, MemoryBudget
from gateway.errors import GatewayError
from gateway.http import Exchange, Request, Response

#: ``scope["extensions"]`` key under which a route finds its exchange (see :func:`receive_into`)
BODY_EXTENSION = "fedfaas.body"
#: budget taken ahead of the bytes while receiving into a route's buffer
STEP = 4 << 20


class AsgiExchange(Exchange):
    """Calls an ASGI app once, handing it the body only when (and if) a route asks for it."""

    on_demand = True

    def __init__(
        self,
        app: Any,
        req: Request,
        server: tuple[str, int],
        *,
        max_body: int,
        budget: MemoryBudget,
    ) -> None:
        self.app, self.req, self.server = app, req, server
        self.max_body, self.budget = max_body, budget
        self.dst = memoryview(b"")
        self.fill = 0
        self.step = 0  # > 0: the budget is taken span by span as the body arrives
        self.hold: Hold | None = None
        self.failed: GatewayError | None = None

    # -- receiving -------------------------------------------------------------------------------
    def get_buffer(self) -> memoryview:
        if not self.step:
            return self.dst[self.fill :]
        assert self.hold is not None
        end = min(len(self.dst), self.fill + self.step)
        if end > self.hold.nbytes:
            self.hold.grow(end - self.hold.nbytes)  # Overloaded: the server fails the body
        return self.dst[self.fill : self.hold.nbytes]

    def buffer_updated(self, n: int) -> None:
        self.fill += n

    async def read(self) -> bytes:
        """The whole body, at most ``max_body`` bytes, held against the budget until the end."""
        n = self.req.content_length or 0
        if n > self.max_body:
            raise self._fail(
                GatewayError(
                    f"request body of {n} bytes exceeds the bound of {self.max_body} for this "
                    f"route (max_json_body)",
                    status=413,
                    code="body_too_large",
                )
            )
        if n == 0:
            await self._receive()
            return b""
        try:
            self.hold = self.budget.reserve(n, f"a {n}-byte request body")
        except GatewayError as exc:
            raise self._fail(exc) from None
        buf = bytearray(n)
        self.dst = memoryview(buf)
        await self._receive()
        return bytes(buf)

    async def receive_into(self, dst: memoryview, what: str) -> None:
        """Receive the whole body (``Content-Length`` must be ``len(dst)``) straight into ``dst``."""
        if (self.req.content_length or 0) != len(dst):
            raise ValueError("the destination must hold exactly Content-Length bytes")
        self.hold = self.budget.reserve(0, what)
        self.step, self.dst = STEP, dst
        await self._receive()

    async def _receive(self) -> None:
        try:
            await self.receive_body()
        except GatewayError as exc:
            raise self._fail(exc) from None
        finally:
            self.dst = memoryview(b"")  # the route's buffer is the route's again

    def _fail(self, exc: GatewayError) -> GatewayError:
        self.failed = exc
        return exc

    def _release(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.release()

    def abort(self) -> None:
        self.dst = memoryview(b"")
        self._release()

    # -- the ASGI call ---------------------------------------------------------------------------
    async def complete(self) -> Response:
        req = self.req
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": req.version,
            "method": req.method,
            "scheme": "http",
            "path": unquote(req.path),
            "raw_path": req.path.encode("latin-1"),
            "query_string": req.query.encode("latin-1"),
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in req.headers],
            "server": self.server,
            "client": req.peer,
            "extensions": {BODY_EXTENSION: self},
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": await self.read(), "more_body": False}
            await asyncio.Event().wait()  # no disconnect events: the body is complete
            return {"type": "http.disconnect"}

        status = 500
        headers: list[tuple[str, str]] = []
        chunks: list[bytes | memoryview] = []

        async def send(msg: dict[str, Any]) -> None:
            nonlocal status, headers
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                headers = [
                    (k.decode("latin-1").lower(), v.decode("latin-1"))
                    for k, v in msg.get("headers", [])
                ]
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))  # kept as given: a model is not copied

        try:
            await self.app(scope, receive, send)
        finally:
            self._release()
        if self.failed is not None:  # whatever the route made of it, say what was wrong
            return Response.error(self.failed)
        headers = [
            (k, v)
            for k, v in headers
            if k not in ("content-length", "transfer-encoding", "connection")
        ]
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return Response(status, body, headers)


async def receive_into(scope: Any, dst: memoryview, what: str) -> None:
    """Receive the request body of ``scope`` straight into ``dst`` (see the module docstring).

    ``what`` names the body in a 503 when the node's budget is spent. Raises
    :class:`GatewayError` (413, 503, a truncated body) or ``ConnectionError``.
    """
    ex = scope.get("extensions", {}).get(BODY_EXTENSION)
    if not isinstance(ex, AsgiExchange):
        raise RuntimeError("this route needs the gateway's own HTTP server (gateway.http)")
    await ex.receive_into(dst, what)

"""Run one fully received request through an ASGI app (the FastAPI control routes)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import unquote

from gateway.errors import GatewayError
from gateway.http import Exchange, Request, Response


class AsgiExchange(Exchange):
    """Collects the (bounded) body and calls an ASGI app once."""

    def __init__(self, app: Any, req: Request, server: tuple[str, int], max_body: int) -> None:
        self.app, self.req, self.server, self.max_body = app, req, server, max_body
        self.body = bytearray()
        self.fill = 0

    def start(self) -> None:
        n = self.req.content_length or 0
        if n > self.max_body:
            raise GatewayError(
                f"request body of {n} bytes exceeds the bound of {self.max_body}",
                status=413,
                code="body_too_large",
            )
        self.body = bytearray(n)

    def get_buffer(self) -> memoryview:
        return memoryview(self.body)[self.fill :]

    def buffer_updated(self, n: int) -> None:
        self.fill += n

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
        }
        sent = False
        body = bytes(self.body)
        self.body = bytearray()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # no disconnect events: the body is complete
            return {"type": "http.disconnect"}

        status = 500
        headers: list[tuple[str, str]] = []
        chunks: list[bytes] = []

        async def send(msg: dict[str, Any]) -> None:
            nonlocal status, headers
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                headers = [
                    (k.decode("latin-1").lower(), v.decode("latin-1"))
                    for k, v in msg.get("headers", [])
                ]
            elif msg["type"] == "http.response.body":
                chunks.append(bytes(msg.get("body", b"")))

        await self.app(scope, receive, send)
        headers = [
            (k, v)
            for k, v in headers
            if k not in ("content-length", "transfer-encoding", "connection")
        ]
        return Response(status, b"".join(chunks), headers)

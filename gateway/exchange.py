"""HTTP/1.1 messages of the gateway's server: the parsed request head, the response, and the
:class:`Exchange` contract a route implements (how its body is received, if at all)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.errors import GatewayError

REASONS = {
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
    #: the request came over TLS (the connection's, set by :mod:`gateway.http`)
    tls: bool = False
    #: the client certificate presented on the connection, as the platform's CA verified it in
    #: the handshake (:meth:`ssl.SSLSocket.getpeercert`'s dict); ``None``: none presented
    client_cert: dict[str, Any] | None = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass
class Response:
    status: int
    body: bytes | memoryview = b""
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
        return cls.json(exc.status, exc.body(), exc.headers())


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

    With ``on_demand`` set, ``complete`` runs right after ``start`` with no body byte read:
    it authenticates and routes the request, picks where the body goes, and only then awaits
    ``receive_body()`` (set by the server), which returns once ``get_buffer``/``buffer_updated``
    took the whole body, or raises what they raised (a :class:`GatewayError`) or
    ``ConnectionError``. A body never asked for is never read into memory: the answer goes out
    at once, then the body is read away (small) or the connection closed (large).
    """

    on_demand: ClassVar[bool] = False
    receive_body: Callable[[], Awaitable[None]]

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


def parse_head(raw: bytes, peer: tuple[str, int] | None) -> Request:
    """Parse a request line and headers (without the blank line); raises :class:`GatewayError`."""
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

"""The python3-http function contract: ``handle(event, context)`` and what its result becomes.

Pure code (no sockets), used by the replica watchdog and unit-tested on its own. Return-value rules
follow python-flask-template's python3-http ``index.py`` (reference section 2) with one deliberate
difference: a ``bytes`` body is sent as is (``application/octet-stream`` unless the handler sets a
Content-Type) instead of being turned into the string ``"b'...'"`` as the alpine template does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

HeaderList = list[tuple[str, str]]
Body = bytes | Iterator[bytes]

HTML = "text/html; charset=utf-8"
JSON_TYPE = "application/json"
OCTETS = "application/octet-stream"


class Headers(Mapping[str, str]):
    """Case-insensitive, multi-valued headers (like werkzeug's ``EnvironHeaders``)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items: HeaderList = list(items)

    def __getitem__(self, key: str) -> str:
        low = key.lower()
        for k, v in self._items:
            if k.lower() == low:
                return v
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and any(k.lower() == key.lower() for k, _ in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for k, _ in self._items))

    def __len__(self) -> int:
        return len(dict.fromkeys(k.lower() for k, _ in self._items))

    def getlist(self, key: str) -> list[str]:
        return [v for k, v in self._items if k.lower() == key.lower()]

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


class Query(Mapping[str, str]):
    """Query arguments: ``query["a"]`` is the first value, ``getlist("a")`` all of them."""

    def __init__(self, query_string: str | bytes = "") -> None:
        if isinstance(query_string, bytes):
            query_string = query_string.decode("latin-1")
        self._pairs = parse_qsl(query_string, keep_blank_values=True)

    def __getitem__(self, key: str) -> str:
        for k, v in self._pairs:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for k, _ in self._pairs))

    def __len__(self) -> int:
        return len(dict.fromkeys(k for k, _ in self._pairs))

    def getlist(self, key: str) -> list[str]:
        return [v for k, v in self._pairs if k == key]

    def to_dict(self) -> dict[str, str]:
        return {k: self[k] for k in self}


@dataclass
class Event:
    """What a handler receives: raw ``body`` bytes, ``headers``, ``method``, ``query``, ``path``."""

    body: bytes
    headers: Headers
    method: str
    query: Query
    path: str


@dataclass
class Context:
    """``context.hostname`` is ``$HOSTNAME`` (``<function>-<replica>`` on the embedded runtime)."""

    hostname: str = "localhost"
    extra: dict[str, Any] = field(default_factory=dict)


class BadResult(TypeError):
    """The handler returned something that cannot become a response."""


def _has_type(headers: HeaderList) -> bool:
    return any(k.lower() == "content-type" for k, _ in headers)


def _header_list(raw: Any) -> HeaderList:
    if raw is None:
        return []
    if isinstance(raw, Mapping):
        return [(str(k), str(v)) for k, v in raw.items()]
    return [(str(k), str(v)) for k, v in raw]


def _encode_body(body: Any, headers: HeaderList) -> Body:
    """Body value -> bytes (or a chunk iterator), adding a default Content-Type."""
    if body is None:
        data, ctype = b"", HTML
    elif isinstance(body, bytes | bytearray | memoryview):
        data, ctype = bytes(body), OCTETS
    elif isinstance(body, dict | list):
        data, ctype = (
            (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode(),
            JSON_TYPE,
        )
    elif isinstance(body, str):
        data, ctype = body.encode("utf-8"), HTML
    else:
        data, ctype = str(body).encode("utf-8"), HTML
    if not _has_type(headers):
        headers.append(("Content-Type", ctype))
    return data


def _chunks(it: Iterator[Any]) -> Iterator[bytes]:
    try:
        for chunk in it:
            yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
    finally:
        close = getattr(it, "close", None)  # a generator's own ``finally`` runs now, not at GC
        if close is not None:
            close()


def to_response(result: Any) -> tuple[int, HeaderList, Body]:
    """Turn a handler's return value into ``(status, headers, body)``.

    * ``None`` -> 200, empty body.
    * ``{"statusCode", "body", "headers"}`` -> that status (default 200); a dict or list body is
      JSON, bytes stay bytes, anything else is ``str(body)``; headers a dict or (name, value) list.
    * ``(body, status)``, ``(body, status, headers)``, ``(body, headers)`` tuples, like Flask.
    * ``str`` / ``bytes`` -> 200 with that body; an iterator/generator streams its chunks.
    * an object with ``status_code``, ``headers`` and ``get_data()`` (a werkzeug/Flask Response).
    """
    if result is None:
        return 200, [("Content-Type", HTML)], b""
    if isinstance(result, dict):
        headers = _header_list(result.get("headers"))
        status = int(result.get("statusCode") or 200)
        return status, headers, _encode_body(result.get("body"), headers)
    if isinstance(result, tuple):
        body, status, headers = result[0], 200, []
        for extra in result[1:3]:
            if isinstance(extra, int):
                status = extra
            else:
                headers = _header_list(extra)
        return status, headers, _encode_body(body, headers)
    if isinstance(result, str | bytes | bytearray | memoryview):
        headers = []
        return 200, headers, _encode_body(result, headers)
    if hasattr(result, "status_code") and hasattr(result, "get_data"):
        headers = _header_list(list(result.headers.items()))
        return int(result.status_code), headers, bytes(result.get_data())
    if isinstance(result, Iterator):
        return 200, [("Content-Type", HTML)], _chunks(result)
    raise BadResult(f"handler returned {type(result).__name__}, which is not a valid response")

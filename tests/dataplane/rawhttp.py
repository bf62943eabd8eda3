"""Raw HTTP/1.1 over a socket, for tests that send a head without its body (or part of it)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    informational: list[int]  # 1xx statuses seen before the final one

    def json(self) -> Any:
        return json.loads(self.body)


def send_head(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    *,
    content_length: int | None = None,
    body: bytes = b"",
    timeout: float = 10.0,
) -> socket.socket:
    """Open a connection and send a request head (and ``body``, maybe only part of the body)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    return s


def read_answer(s: socket.socket, timeout: float = 10.0) -> Answer:
    """Read one response (skipping 1xx ones) from ``s``; raises ``TimeoutError`` if none comes."""
    s.settimeout(timeout)
    data = b""
    informational: list[int] = []
    while True:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"connection closed before an answer ({data[:200]!r})")
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if 100 <= status < 200:
            informational.append(status)
            continue
        length = int(headers.get("content-length", "0"))
        while len(data) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return Answer(status, headers, data[:length], informational)


def closed_by_peer(s: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the other side closes ``s`` within ``timeout`` (reading and dropping any data)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True

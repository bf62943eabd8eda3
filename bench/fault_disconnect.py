"""Fault (l) of the campaign (:mod:`bench.fault_kinds`): a client that breaks its upload off
half way, on the platform's default TLS as on plain HTTP.

The client sends the request head and half the body, then closes its sending side and reads
the gateway's answer: on plain HTTP a TCP half-close (``shutdown(SHUT_WR)``), over TLS the TLS
half-close, a ``close_notify`` alert (:func:`broken_off`). Either way the gateway sees the body
end early and answers 400 ``truncated_body``, freeing the update's buffer. A TCP half-close
under TLS would not do: the gateway's TLS layer (asyncio's) takes a bare end of the stream as
the end of the connection and drops what the gateway answers.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from safetensors.numpy import save

from bench.fault_platform import Campaign, JobRun, assigned

#: bytes handed to TLS per write (the body is tens of MiB)
CHUNK = 1 << 20


def broken_off(url: str, head: bytes, part: bytes, verify: ssl.SSLContext | None) -> str:
    """Send ``head`` and ``part`` to ``url``'s host and port, close the sending side and return
    the error code of the answer (``none``: the connection closed without one). ``verify``:
    how an ``https://`` URL's server is checked (the platform's CA); None for ``http://``."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
    if u.scheme == "https" and verify is None:
        raise ValueError(f"{url} is https: give the platform's CA (verify)")
    with socket.create_connection((host, port), timeout=30) as s:
        if u.scheme != "https" or verify is None:
            s.sendall(head + part)
            s.shutdown(socket.SHUT_WR)  # the client goes: the gateway sees the body end early
            return answer_code(_read_plain(s))
        return answer_code(_tls_half_close(s, host, verify, head, part))


def _read_plain(s: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    return data


def _tls_half_close(
    s: socket.socket, host: str, verify: ssl.SSLContext, head: bytes, part: bytes
) -> bytes:
    """TLS over ``s`` through memory BIOs (an ``SSLSocket`` cannot send ``close_notify`` and
    still read): handshake, ``head + part``, ``close_notify``, then the answer to its end."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = verify.wrap_bio(incoming, outgoing, server_hostname=host)

    def flush() -> None:
        if data := outgoing.read():
            s.sendall(data)

    def pump() -> bool:
        chunk = s.recv(65536)
        if not chunk:
            incoming.write_eof()
            return False
        incoming.write(chunk)
        return True

    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            flush()
            if not pump():
                raise ConnectionError(f"{host}: the connection closed in the handshake") from None
    flush()
    payload = memoryview(head + part)
    for at in range(0, len(payload), CHUNK):
        tls.write(payload[at : at + CHUNK])
        flush()
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.unwrap()  # sends close_notify; the answer comes before the server's own
    flush()
    data = b""
    with contextlib.suppress(ssl.SSLError, OSError):
        while True:
            try:
                chunk = tls.read(65536)
            except ssl.SSLWantReadError:
                if not pump():
                    break
                continue
            if not chunk:
                break
            data += chunk
    return data


def answer_code(data: bytes) -> str:
    """The error code of an HTTP answer (``data``, read to its close), or ``none``."""
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return "none"
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(body)["error"])
    return head.split(b"\r\n", 1)[0].decode("latin-1")


def disconnects(c: Campaign, run: JobRun, n: int = 100) -> dict[str, Any]:
    """``n`` uploads that break off half way (the head and half the body, then the client
    closes its side: :func:`broken_off`), by a client whose real upload of the round waits
    until they are done."""
    assert run.model is not None
    client = run.held
    token = c.tokens[run.job][client]
    _, url = assigned(c, run.job, client)
    body = save(run.model.update(0))
    host = urlsplit(url).netloc
    rnd = int(c.cp_get(f"/v1/jobs/{run.job}")["round"]["number"])
    verify = c.client_tls()
    answers: dict[str, int] = {}
    for _ in range(n):
        head = (
            f"POST /v1/jobs/{run.job}/rounds/{rnd}/updates HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nX-Client-Id: {client}\r\n"
            f"X-Sample-Count: 3\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        code = broken_off(url, head, body[: len(body) // 2], verify)
        answers[code] = answers.get(code, 0) + 1
    return {
        "disconnects": n,
        "client": client,
        "bytes_each": len(body) // 2,
        "answers": answers,
        "tls": url.startswith("https://"),
        "ended_at": time.monotonic(),
    }


def disconnects_evidence(run: JobRun) -> tuple[bool, str]:
    i = run.injected
    n, cut = i.get("disconnects", 0), (i.get("answers") or {}).get("truncated_body", 0)
    return cut >= n > 0, (
        f"{n} uploads of {i.get('client')} broken off after {i.get('bytes_each', 0) / 2**20:.1f}"
        f" MiB{' (TLS: close_notify)' if i.get('tls') else ''}, each while the gateway received"
        f" it into the store: answered {i.get('answers')}"
    )

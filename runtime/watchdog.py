"""One replica: an of-watchdog (HTTP mode) and the python3-http template server in one process.

Usage: ``python -m runtime.watchdog --function-dir DIR --port N [--fd FD] [--parent-pid PID]``.

It imports ``DIR/handler.py`` as ``function.handler`` (so ``from .x import y`` works as in the
template), then serves:

* ``GET /_/health`` and ``/_/ready``: 200 ``OK`` once the handler is loaded and the socket listens,
  503 while draining after SIGTERM (``/_/ready`` also 429 at ``max_inflight``);
* every other path: first the function token (:mod:`runtime.function_auth`):
  ``Authorization: Bearer <token>`` must match the secret file ``fedfaas-function-token`` in
  ``$FEDFAAS_SECRETS_DIR`` (default ``/var/openfaas/secrets``), else 401 JSON
  ``{"error": "unauthorized", "detail"}`` with ``WWW-Authenticate: Bearer``, before any of the
  body is read; then ``handle(event, context)`` in a thread pool, the result turned into a
  response by :func:`runtime.contract.to_response`; ``X-Duration-Seconds`` on every
  response. Without the token file the replica refuses to start (exit 1, the reason logged).

Environment (of-watchdog names): ``exec_timeout`` (Go duration or seconds; 0 = none; expiry gives
504), ``max_inflight`` (0 = unlimited; above it 429), ``healthcheck_interval`` (drain wait after
SIGTERM; default 0 here because the runtime stops routing to a replica before it signals it).
Output lines go to stdout/stderr prefixed with an RFC3339 time and the stream name.
With ``FEDFAAS_TLS_CERT_FILE``, ``FEDFAAS_TLS_KEY_FILE`` and ``FEDFAAS_TLS_CA_FILE`` (the
runtime's function TLS) the port speaks HTTPS only and a client must present a certificate the
CA signed (the runtime, the request tracker, another replica); files that cannot work (one
missing, a key others can read) stop the start (exit 1, the reason logged).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import io
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from runtime.contract import Context, Event, Headers, Query, to_response
from runtime.function_auth import (
    FunctionToken,
    NoToken,
    token_path,
    unauthorized_body,
    unavailable_body,
)

log = logging.getLogger("runtime.watchdog")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Event, Context], Any]

_DUR = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_END = object()


def parse_duration(text: str | None, default: float) -> float:
    """Seconds from a Go duration (``1m30s``, ``500ms``) or a bare number of seconds."""
    if text is None or not text.strip():
        return default
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DUR.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


class _Prefixed(io.TextIOBase):
    """Line-buffered writer that prefixes each line with a UTC timestamp and a stream name."""

    def __init__(self, raw: TextIO, name: str) -> None:
        self._raw, self._name, self._buf, self._lock = raw, name, "", threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self._buf += s
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                self._raw.write(f"{ts} {self._name}: {line}\n")
            self._raw.flush()
        return len(s)

    def flush(self) -> None:
        self._raw.flush()


def load_handler(function_dir: Path) -> Handler:
    """Import ``function_dir/handler.py`` as module ``function.handler``; return its ``handle``."""
    function_dir = function_dir.resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != function_dir]
    init = function_dir / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            "function", init, submodule_search_locations=[str(function_dir)]
        )
        assert spec is not None and spec.loader is not None
        pkg = importlib.util.module_from_spec(spec)
        sys.modules["function"] = pkg
        spec.loader.exec_module(pkg)
    else:
        pkg = types.ModuleType("function")
        pkg.__path__ = [str(function_dir)]
        sys.modules["function"] = pkg
    module = importlib.import_module("function.handler")
    handle = getattr(module, "handle", None)
    if not callable(handle):
        raise AttributeError(f"{function_dir / 'handler.py'} has no handle(event, context)")
    return handle  # type: ignore[no-any-return]


class WatchdogApp:
    """ASGI app serving the health endpoints and the handler."""

    def __init__(
        self,
        handle: Handler,
        hostname: str,
        exec_timeout: float,
        max_inflight: int,
        token: FunctionToken,
    ) -> None:
        self.handle, self.context, self.token = handle, Context(hostname=hostname), token
        self.exec_timeout, self.max_inflight = exec_timeout, max_inflight
        self.inflight, self.draining = 0, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in ("/_/health", "/_/ready"):
            if method not in ("GET", "HEAD"):
                await _plain(send, 405, b"Method not allowed")
            elif self.draining:
                await _plain(send, 503, b"draining")
            elif path == "/_/ready" and self.max_inflight and self.inflight >= self.max_inflight:
                await _plain(send, 429, b"Concurrent request limit exceeded")
            else:
                await _plain(send, 200, b"OK")
            return
        if not await self._authorized(scope, send):
            return
        if self.max_inflight and self.inflight >= self.max_inflight:
            await _plain(send, 429, b"Concurrent request limit exceeded", internal=True)
            return
        self.inflight += 1
        try:
            await self._invoke(scope, receive, send)
        finally:
            self.inflight -= 1

    async def _authorized(self, scope: Scope, send: Send) -> bool:
        """Check the bearer token (headers only: nothing of the body is read); answer if not."""
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            why = self.token.refusal(header)
        except NoToken as exc:
            log.error("%s", exc)
            await _json(send, 503, unavailable_body(str(exc)))
            return False
        if why is None:
            return True
        await _json(send, 401, unauthorized_body(why), [(b"www-authenticate", b"Bearer")])
        return False

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        chunks: list[bytes] = []
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        chunks.clear()
        headers = Headers((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
        event = Event(
            body, headers, scope["method"], Query(scope.get("query_string", b"")), scope["path"]
        )
        del body
        call = asyncio.to_thread(self.handle, event, self.context)
        try:
            result = await asyncio.wait_for(call, self.exec_timeout or None)
            status, out_headers, out_body = to_response(result)
        except TimeoutError:
            log.error(
                "exec_timeout (%.1fs) exceeded for %s %s",
                self.exec_timeout,
                scope["method"],
                scope["path"],
            )
            await _plain(send, 504, b"exec_timeout exceeded", internal=True, start=start)
            return
        except Exception:
            log.exception("handler failed for %s %s", scope["method"], scope["path"])
            await _plain(
                send, 500, b"handler error: see the function's logs", internal=True, start=start
            )
            return
        raw = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in out_headers
            if k.lower() not in ("content-length", "transfer-encoding")
        ]
        raw.append((b"x-duration-seconds", f"{time.perf_counter() - start:f}".encode()))
        if isinstance(out_body, bytes):
            raw.append((b"content-length", str(len(out_body)).encode()))
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": out_body})
            return
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await _stream(receive, send, out_body)


async def _stream(receive: Receive, send: Send, it: Iterator[bytes]) -> None:
    """Send the chunks of a streaming result; stop (and close the iterator, so that its
    ``finally`` runs) when the caller disconnects. A handler error mid-stream leaves the response
    incomplete, so the connection is closed and the caller sees an error, not a short body."""
    gone = asyncio.ensure_future(receive())  # the body is read: the next message is a disconnect
    try:
        while (chunk := await asyncio.to_thread(next, it, _END)) is not _END:
            if gone.done():
                log.info("caller disconnected; streaming response stopped")
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except Exception:
        log.exception("streaming response failed; closing the connection")
        return
    finally:
        gone.cancel()
        close = getattr(it, "close", None)
        if close is not None:
            await asyncio.to_thread(close)
    await send({"type": "http.response.body", "body": b""})


async def _plain(
    send: Send, status: int, body: bytes, *, internal: bool = False, start: float | None = None
) -> None:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    if internal:
        headers.append((b"x-openfaas-internal", b"of-watchdog"))
    if start is not None:
        headers.append((b"x-duration-seconds", f"{time.perf_counter() - start:f}".encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-openfaas-internal", b"of-watchdog"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _watch_parent(parent_pid: int) -> None:
    """Exit when the runtime that started us is gone (no orphans if it is SIGKILLed)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone; exiting", parent_pid)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5.0)
            os._exit(1)


def _replica_tls(env: dict[str, str]) -> Any:
    """The runtime's function TLS (:func:`core.tls.replica_files`: HTTPS only, a client
    certificate of the platform's CA required), or None; exits 1 when its files cannot work.
    core.tls (pydantic) is imported only where the environment names a certificate or key
    (``core.tls.CERT_FILE_ENV``, ``KEY_FILE_ENV``): a replica without TLS starts without it."""
    if not env.get("FEDFAAS_TLS_CERT_FILE") and not env.get("FEDFAAS_TLS_KEY_FILE"):
        return None
    from core.tls import TlsError, replica_files

    try:
        return replica_files(env)
    except TlsError as exc:
        log.error("refusing to start: %s", exc)
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from core.tls_server import TlsServer  # uvicorn's; core.tls (pydantic) only with TLS

    env = dict(os.environ)  # of-watchdog reads lower-case variable names
    ap = argparse.ArgumentParser(
        prog="python -m runtime.watchdog", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--function-dir", required=True, type=Path)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(env.get("port", "8080")))
    ap.add_argument("--fd", type=int, default=None, help="serve on this bound socket (inherited)")
    ap.add_argument("--parent-pid", type=int, default=0)
    args = ap.parse_args(argv)

    if sys.__stdout__ is not None and sys.__stderr__ is not None:
        sys.stdout = _Prefixed(sys.__stdout__, "stdout")
        sys.stderr = _Prefixed(sys.__stderr__, "stderr")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )

    token = FunctionToken(token_path(env))
    try:
        token.load()
    except NoToken as exc:  # secure by default: no token, no function
        log.error("refusing to start: %s", exc)
        sys.exit(1)
    tls = _replica_tls(env)
    exec_timeout = parse_duration(env.get("exec_timeout"), 30.0)
    drain = parse_duration(env.get("healthcheck_interval"), 0.0)
    app = WatchdogApp(
        load_handler(args.function_dir),
        os.environ.get("HOSTNAME", "localhost"),
        exec_timeout,
        int(env.get("max_inflight", "0") or 0),
        token,
    )
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()

    class Server(TlsServer):  # with TLS: plain HTTP answered a 400 tls_required
        def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
            app.draining = True
            if drain > 0:
                threading.Timer(drain, super().handle_exit, (sig, frame)).start()
            else:
                super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=int(parse_duration(env.get("write_timeout"), 30.0)),
        ssl_certfile=str(tls.cert) if tls is not None else None,
        ssl_keyfile=str(tls.key) if tls is not None else None,
    )
    server_tls = None
    if tls is not None:
        config.load()  # then the context of core.tls replaces the one uvicorn built
        config.ssl = server_tls = tls.server_context()
    log.info(
        "function %s loaded from %s; listening on %s:%d%s",
        os.environ.get("FEDFAAS_FUNCTION_NAME", "?"),
        args.function_dir,
        args.host,
        args.port,
        " (HTTPS, client certificates required)" if tls is not None else "",
    )
    # a socket bound by the runtime (no race for the port), else bind --host/--port here
    Server(config, server_tls).run(
        sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None
    )


if __name__ == "__main__":
    main()

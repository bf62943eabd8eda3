"""The platform smoke run (``fedfaas demo`` until the data-plane demo exists).

Brings the platform up (MinIO, Redis, the runtime with the stack deployed), invokes the ``echo``
function through the OpenFaaS route ``/function/echo``, shows the status, and brings it down
again, unless it was already running before, in which case it is left as it was.
"""

from __future__ import annotations

import logging
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.auth import bearer
from fedfaas.platform import credentials
from fedfaas.platform.context import Context
from fedfaas.platform.errors import PlatformError
from fedfaas.platform.orchestrator import Platform
from fedfaas.platform.report import render_status
from fedfaas.settings import PlatformSettings

log = logging.getLogger(__name__)

SMOKE_FUNCTION = "echo"


@dataclass(frozen=True)
class Invocation:
    status: int
    body: bytes
    headers: dict[str, str]  # names lowercased


def invoke(
    runtime_url: str,
    function: str,
    body: bytes,
    token: str,
    timeout: float = 30.0,
    context: ssl.SSLContext | None = None,
) -> Invocation:
    """``POST /function/<function>`` with the function token and return what came back;
    over ``https`` the runtime is verified with ``context`` (``fedfaas up``, TLS by default: the
    platform's CA and ``fedfaas``'s own certificate, :meth:`Context.client_ssl`)."""
    req = urllib.request.Request(
        f"{runtime_url}/function/{function}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/octet-stream", **bearer(token)},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return Invocation(r.status, r.read(), {k.lower(): v for k, v in r.headers.items()})
    except urllib.error.HTTPError as exc:
        return Invocation(exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()})
    except (urllib.error.URLError, OSError) as exc:
        raise PlatformError(f"cannot invoke {function} at {runtime_url}: {exc}") from exc


def run(settings: PlatformSettings, say: Callable[[str], None]) -> None:
    """Up, invoke ``echo``, status, down. Raises :class:`PlatformError` on any failure."""
    platform = Platform(settings)
    say(f"starting the platform in {settings.state_dir} ...")
    result = platform.up()
    if result.already_running:
        say("the platform was already running; it stays up after the smoke run")
    try:
        runtime = result.state.record("runtime")
        if runtime is None:
            raise PlatformError("the runtime is not part of this platform")
        payload = b"fedfaas smoke " + secrets.token_hex(8).encode()
        say(f"invoking {SMOKE_FUNCTION} at {runtime.address}/function/{SMOKE_FUNCTION}")
        token = credentials.read(
            Path(result.state.state_dir) / "secrets", credentials.FUNCTION_TOKEN
        )
        # a TLS platform's runtime: verified against its CA, fedfaas's certificate presented
        tls = Context.of(result.state).client_ssl()
        got = invoke(runtime.address, SMOKE_FUNCTION, payload, token, context=tls)
        if got.status != 200 or payload not in got.body:
            raise PlatformError(
                f"{SMOKE_FUNCTION} answered {got.status} {got.body[:200]!r}; "
                f"expected 200 echoing {payload!r}"
            )
        took = got.headers.get("x-duration-seconds", "?")
        say(
            f"{SMOKE_FUNCTION} answered 200 with the payload (X-Duration-Seconds {took}, "
            f"X-Call-Id {got.headers.get('x-call-id', '-')})"
        )
        say(render_status(platform.status()))
    finally:
        if not result.already_running:
            say("stopping the platform ...")
            stopped = platform.down()
            say(f"stopped: {', '.join(stopped)}; {settings.state_dir} is clean (logs kept)")
    say("smoke run passed")

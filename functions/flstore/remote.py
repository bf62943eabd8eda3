"""A reducer's calls for the other cache functions' parts of a query (``POST /part``)."""

from __future__ import annotations

import os
import threading
from typing import Any

_ENV = "FEDFAAS_FLSTORE_"


class PartFailed(RuntimeError):
    """Another function did not give its part of a query."""

    def __init__(self, function: str, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{function} /part: HTTP {status} {body.get('detail', '')}"[:300])
        self.function, self.status, self.body = function, status, body


_clients_lock = threading.Lock()
_clients: list[Any] = []


def remote_part(function: str, endpoint: str | None, body: dict[str, Any]) -> bytes:
    """``POST /part`` on another cache function: at its own address where the plan gives one,
    else through the gateway; with the function token (the secret every function has)."""
    import httpx

    from core.tls import TlsError, platform_verify
    from runtime.function_auth import FunctionToken, token_path

    with _clients_lock:
        if not _clients:
            timeout = float(os.environ.get(_ENV + "CALL_TIMEOUT_S", "120") or 120)
            try:  # the gateway over https: the platform's CA (no SSL_CERT_FILE in functions)
                verify = platform_verify()
            except TlsError as exc:
                raise PartFailed(function, 502, {"detail": str(exc)}) from None
            _clients.append(httpx.Client(timeout=timeout, verify=verify))
        client = _clients[0]
    gateway = os.environ.get(_ENV + "GATEWAY_URL", "").rstrip("/")
    url = f"{endpoint}/part" if endpoint else f"{gateway}/function/{function}/part"
    token = FunctionToken(token_path()).load().decode()
    try:
        r = client.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        raise PartFailed(function, 502, {"detail": f"unreachable: {exc!r}"}) from None
    if r.status_code != 200:
        try:
            err = r.json()
        except ValueError:
            err = {"detail": r.text[:200]}
        raise PartFailed(function, r.status_code, err if isinstance(err, dict) else {})
    return bytes(r.content)

"""Client of the OpenFaaS provider API, used to scale the aggregator function.

The same calls reach the embedded runtime (``python -m fedfaas.runtime``) and a real OpenFaaS
gateway (``reference/openfaas.md``): ``POST /system/scale-function/{name}`` with a
ScaleServiceRequest ``{"serviceName", "replicas"[, "namespace"]}`` (answer 202) and
``GET /system/function/{name}`` (FunctionStatus: ``replicas`` desired, ``availableReplicas``
ready). ``/system/*`` takes HTTP basic auth; credentials are files, as in OpenFaaS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from control_plane.errors import InvalidInput, ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FunctionStatus:
    """What the provider reports about one function."""

    name: str
    replicas: int
    available_replicas: int
    labels: dict[str, str] = field(default_factory=dict)

    def scale_bounds(self, max_default: int = 20) -> tuple[int, int]:
        """``(min, max)`` from ``com.openfaas.scale.min`` / ``.max`` (defaults 1 and 20)."""

        def num(key: str, default: int) -> int:
            try:
                return int(self.labels.get(key, default))
            except (TypeError, ValueError):
                return default

        return num("com.openfaas.scale.min", 1), num("com.openfaas.scale.max", max_default)


def read_basic_auth(auth_dir: Path) -> tuple[str, str]:
    """Read ``basic-auth-user`` and ``basic-auth-password`` (whitespace trimmed) from a folder."""
    try:
        user = (auth_dir / "basic-auth-user").read_text().strip()
        password = (auth_dir / "basic-auth-password").read_text().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read basic-auth files in {auth_dir}: {exc}") from exc
    return user, password


class Provider:
    """Async client of the provider API.

    Parameters
    ----------
    base_url
        Gateway or embedded runtime URL, e.g. ``http://127.0.0.1:8080``.
    auth
        ``(user, password)`` for basic auth on ``/system/*``, or None when auth is off.
    namespace
        Function namespace sent with every call (None: the provider's default).
    timeout
        Seconds per HTTP call.
    transport
        Optional httpx transport (tests of request shapes only).
    """

    def __init__(
        self,
        base_url: str,
        auth: tuple[str, str] | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.namespace = namespace
        self._client = httpx.AsyncClient(
            base_url=self.base_url, auth=auth, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.aclose()

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def healthz(self) -> bool:
        """True when the provider answers ``GET /healthz`` with 200."""
        try:
            r = await self._client.get("/healthz")
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def scale(self, name: str, replicas: int) -> None:
        """Ask for ``replicas`` replicas of ``name`` (202 expected).

        Raises
        ------
        InvalidInput
            ``replicas < 1`` (OpenFaaS CE rejects 0; scale-to-zero is the provider's job).
        ProviderError
            Any non-2xx answer (404 unknown function, 401 bad credentials, ...).
        """
        if replicas < 1:
            raise InvalidInput(f"replicas must be >= 1, got {replicas}")
        body: dict[str, Any] = {"serviceName": name, "replicas": int(replicas)}
        if self.namespace:
            body["namespace"] = self.namespace
        r = await self._call("POST", f"/system/scale-function/{name}", json=body)
        log.info("scaled %s to %d replicas (HTTP %d)", name, replicas, r.status_code)

    async def function(self, name: str) -> FunctionStatus:
        """``GET /system/function/{name}``."""
        params = {"namespace": self.namespace} if self.namespace else None
        r = await self._call("GET", f"/system/function/{name}", params=params)
        try:
            data = r.json()
            return FunctionStatus(
                name=str(data.get("name", name)),
                replicas=int(data.get("replicas", 0)),
                available_replicas=int(data.get("availableReplicas", 0)),
                labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise ProviderError(f"GET /system/function/{name}: unreadable answer: {exc}") from exc

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ProviderError(f"{method} {self.base_url}{path}: {exc!r}") from exc
        if r.status_code >= 300:
            raise ProviderError(
                f"{method} {path} answered {r.status_code}: {r.text[:200]!r}", r.status_code
            )
        return r

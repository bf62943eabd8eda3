"""A small client of the OpenFaaS gateway API (the embedded runtime or a real gateway).

Creates and removes the ``flstore-cache-N`` functions and invokes them. Only the calls FLStore
needs: deploy (POST /system/functions), delete, status (GET /system/function/{name}), list, and
``/function/{name}/<path>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)

HANDLER_ANNOTATION = "com.fedfaas.handler"


class ProviderError(RuntimeError):
    """The provider refused a call or could not be reached."""

    def __init__(self, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.status = status


class Provider:
    """OpenFaaS gateway client.

    Parameters
    ----------
    url
        Gateway base URL (``http://127.0.0.1:8080``).
    auth
        ``(user, password)`` for ``/system/*`` or ``None``.
    auth_dir
        Folder with ``basic-auth-user`` / ``basic-auth-password`` (used when ``auth`` is None).
    """

    def __init__(
        self,
        url: str,
        auth: tuple[str, str] | None = None,
        auth_dir: str | Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        if auth is None and auth_dir:
            d = Path(auth_dir)
            if (d / "basic-auth-user").is_file():
                auth = (
                    (d / "basic-auth-user").read_text().strip(),
                    (d / "basic-auth-password").read_text().strip(),
                )
        self._system = httpx.Client(base_url=self.url, auth=auth, timeout=timeout)
        self._invoke = httpx.Client(
            base_url=self.url, timeout=timeout, limits=httpx.Limits(max_connections=64)
        )

    def close(self) -> None:
        self._system.close()
        self._invoke.close()

    def deploy(
        self,
        name: str,
        image: str,
        env: dict[str, str],
        handler_dir: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        """Create function ``name`` (or update it if it exists)."""
        spec: dict[str, Any] = {
            "service": name,
            "image": image,
            "envVars": env,
            "labels": {"com.fedfaas.role": "flstore-cache", **(labels or {})},
            "annotations": {},
        }
        if handler_dir:
            spec["annotations"][HANDLER_ANNOTATION] = str(Path(handler_dir).resolve())
        r = self._system.post("/system/functions", json=spec)
        if r.status_code == 409 or (r.status_code == 400 and "exist" in r.text):
            r = self._system.put("/system/functions", json=spec)
        if r.status_code not in (200, 201, 202):
            raise ProviderError(
                f"deploy {name}: HTTP {r.status_code} {r.text[:300]}", r.status_code
            )
        log.info("deployed cache function %s", name)

    def delete(self, name: str) -> bool:
        """Remove function ``name``; False if it did not exist."""
        r = self._system.request("DELETE", "/system/functions", json={"functionName": name})
        if r.status_code == 404:
            return False
        if r.status_code not in (200, 202):
            raise ProviderError(
                f"delete {name}: HTTP {r.status_code} {r.text[:300]}", r.status_code
            )
        return True

    def status(self, name: str) -> dict[str, Any] | None:
        """FunctionStatus of ``name`` or None when it does not exist."""
        r = self._system.get(f"/system/function/{name}")
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise ProviderError(f"status {name}: HTTP {r.status_code}", r.status_code)
        out: dict[str, Any] = r.json()
        return out

    def list(self) -> list[dict[str, Any]]:
        r = self._system.get("/system/functions")
        if r.status_code != 200:
            raise ProviderError(f"list: HTTP {r.status_code}", r.status_code)
        out: list[dict[str, Any]] = r.json()
        return out

    def call(
        self, name: str, path: str, body: Any = None, timeout: float | None = None
    ) -> httpx.Response:
        """Invoke ``/function/{name}{path}`` (GET without body, POST with a JSON body)."""
        url = f"/function/{name}{path}"
        kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if body is None:
            return self._invoke.get(url, **kw)
        return self._invoke.post(url, json=body, **kw)

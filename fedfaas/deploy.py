"""``fedfaas deploy -f stack.yml``: what ``faas-cli deploy -f stack.yml`` sends, to any gateway.

Per function (reference/openfaas.md section 7): with ``replace``, DELETE ``/system/functions``
first; then PUT the FunctionDeployment, and POST the same body if the PUT answers 404. Only 200 and
202 count as success. ``Authorization`` is Basic when credentials are given, else an empty Bearer
token as faas-cli sends without saved credentials (sent as ``Bearer``: HTTP strips the trailing
space anyway, and h11 refuses to send it).

:class:`GatewayClient` also has the other calls faas-cli makes (list, describe, scale, invoke,
remove, logs), for the CLI and the tests.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fedfaas.stackfile import load_stack, resolve_gateway

log = logging.getLogger(__name__)

try:
    from importlib.metadata import version as _pkg_version

    _VERSION = _pkg_version("fedfaas")
except Exception:  # running from a source tree
    _VERSION = "0.0.0"

USER_AGENT = f"fedfaas-cli/{_VERSION} (faas-cli compatible)"
OK_CODES = (200, 202)


@dataclass(frozen=True)
class DeployResult:
    """Outcome for one function: the last status code and the gateway's message."""

    function: str
    status: int
    method: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status in OK_CODES


class DeployError(RuntimeError):
    """At least one function failed to deploy; ``results`` has every outcome."""

    def __init__(self, results: list[DeployResult]) -> None:
        failed = [r for r in results if not r.ok]
        super().__init__(
            "deploy failed for "
            + ", ".join(
                f"{r.function} ({r.method} {r.status}: {r.message.strip()[:200]})" for r in failed
            )
        )
        self.results = results


def auth_header(auth: tuple[str, str] | None) -> str:
    """``Basic base64(user:pass)`` or the empty Bearer token faas-cli sends without credentials."""
    if auth is None:
        return "Bearer"
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    return f"Basic {token}"


class GatewayClient:
    """A small client for an OpenFaaS-compatible gateway (real OpenFaaS or the embedded runtime).

    Parameters
    ----------
    gateway_url:
        e.g. ``http://127.0.0.1:8080``.
    auth:
        ``(user, password)`` for basic auth on ``/system/*``; None sends an empty Bearer token.
    timeout:
        Seconds per request (invocations of large bodies may need more).
    """

    def __init__(
        self, gateway_url: str, auth: tuple[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        self.url = gateway_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            trust_env=False,
            headers={"User-Agent": USER_AGENT, "Authorization": auth_header(auth)},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what faas-cli deploy sends
    def deploy_one(
        self, body: dict[str, Any], *, replace: bool = False, update: bool = True
    ) -> DeployResult:
        """Deploy one FunctionDeployment body: [DELETE], PUT, POST on 404."""
        name = str(body["service"])
        if replace:
            self.remove(name, body.get("namespace", ""))
        method = "PUT" if update else "POST"
        r = self._http.request(method, "/system/functions", json=body)
        if update and r.status_code == 404:
            method = "POST"
            r = self._http.post("/system/functions", json=body)
        result = DeployResult(name, r.status_code, method, r.text)
        if r.status_code == 401:
            log.error("%s: unauthorized; give credentials (faas-cli login)", name)
        log.info("deploy %s: %s %d", name, method, r.status_code)
        return result

    # ---- the other faas-cli calls
    def list_functions(self, namespace: str = "") -> list[dict[str, Any]]:
        r = self._http.get(
            "/system/functions", params={"namespace": namespace} if namespace else None
        )
        r.raise_for_status()
        return list(r.json())

    def describe(self, name: str, namespace: str = "") -> dict[str, Any] | None:
        """FunctionStatus, or None when the function does not exist."""
        params = {"namespace": namespace, "usage": "1"} if namespace else {"usage": "1"}
        r = self._http.get(f"/system/function/{name}", params=params)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return dict(r.json())

    def scale(self, name: str, replicas: int, namespace: str = "") -> httpx.Response:
        body = {"serviceName": name, "replicas": replicas, "namespace": namespace}
        return self._http.post(f"/system/scale-function/{name}", json=body)

    def remove(self, name: str, namespace: str = "") -> httpx.Response:
        return self._http.request(
            "DELETE", "/system/functions", json={"functionName": name, "namespace": namespace}
        )

    def logs(self, name: str, tail: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, str] = {"name": name, "follow": "false"}
        if tail is not None:
            params["tail"] = str(tail)
        r = self._http.get("/system/logs", params=params)
        r.raise_for_status()
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def invoke(
        self,
        name: str,
        body: bytes | Iterable[bytes] | None = None,
        *,
        method: str = "POST",
        path: str = "",
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Call ``/function/<name>[/path]`` (no auth header, as faas-cli invoke)."""
        req = self._http.build_request(
            method,
            f"/function/{name}{path}",
            content=body,
            headers=headers,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        req.headers.pop("Authorization", None)
        return self._http.send(req)


def deploy(
    stack_path: str | Path,
    gateway_url: str | None = None,
    auth: tuple[str, str] | None = None,
    filter: str | None = None,  # noqa: A002 - the faas-cli flag name
    replace: bool = False,
    *,
    resolve: bool = True,
) -> list[DeployResult]:
    """Deploy the functions of a stack file as ``faas-cli deploy -f`` does.

    Parameters
    ----------
    stack_path:
        The stack file (``${VAR}`` substituted, ``template/<lang>/template.yml`` read for fprocess).
    gateway_url:
        Gateway. With ``resolve`` (the default) it is faas-cli's ``--gateway``: None or the
        default ``http://127.0.0.1:8080`` lets the stack's ``provider.gateway`` or
        ``OPENFAAS_URL`` win, as in faas-cli.
    auth:
        ``(user, password)`` or None (empty Bearer token).
    filter:
        Glob on function names (``--filter``).
    replace:
        DELETE each function before deploying it (``--replace``).
    resolve:
        False: deploy to exactly ``gateway_url`` (required then), whatever the stack file and
        ``OPENFAAS_URL`` say; for a caller that knows where its gateway is (``fedfaas up``).

    Returns
    -------
    list[DeployResult]
        One per function, in stack-file order.

    Raises
    ------
    DeployError
        A function was not accepted (status other than 200/202); carries every result.
    fedfaas.stackfile.StackError
        The stack file is invalid.
    ValueError
        ``resolve=False`` without a ``gateway_url``.
    """
    if not resolve and not gateway_url:
        raise ValueError("deploy(resolve=False) needs the gateway_url to deploy to")
    stack = load_stack(stack_path)
    url = resolve_gateway(gateway_url, stack.gateway) if resolve else str(gateway_url)
    results: list[DeployResult] = []
    with GatewayClient(url, auth) as client:
        for fn in stack.select(filter):
            try:
                results.append(client.deploy_one(fn.deployment(), replace=replace))
            except httpx.HTTPError as exc:
                results.append(DeployResult(fn.name, 0, "PUT", f"cannot reach {url}: {exc}"))
    if any(not r.ok for r in results):
        raise DeployError(results)
    return results

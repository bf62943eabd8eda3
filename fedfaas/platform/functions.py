"""The functions of the stack on the embedded runtime: deploy them, wait for them, list them."""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from fedfaas.platform.context import Context
from fedfaas.platform.errors import PlatformError

if TYPE_CHECKING:
    from fedfaas.deploy import DeployResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FunctionInfo:
    """A deployed function as the runtime reports it (missing numbers are 0, as in OpenFaaS)."""

    name: str
    replicas: int
    available: int

    @property
    def ready(self) -> bool:
        return self.available > 0


def _auth_header(ctx: Context) -> dict[str, str]:
    try:
        user, password = ctx.basic_auth()
    except OSError as exc:
        raise PlatformError(f"cannot read the runtime's credentials: {exc}") from exc
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def list_functions(ctx: Context, timeout: float = 2.0) -> list[FunctionInfo]:
    """``GET /system/functions`` on the runtime, with the platform's basic auth."""
    req = urllib.request.Request(
        f"{ctx.url('runtime')}/system/functions", headers=_auth_header(ctx)
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body: list[dict[str, Any]] = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PlatformError(f"cannot list functions at {ctx.url('runtime')}: {exc}") from exc
    return sorted(
        (
            FunctionInfo(
                str(f["name"]), int(f.get("replicas") or 0), int(f.get("availableReplicas") or 0)
            )
            for f in body
        ),
        key=lambda f: f.name,
    )


def deploy_to(
    url: str,
    auth: tuple[str, str] | None,
    stack_file: Path,
    filter: str | None = None,
    replace: bool = False,
) -> list[DeployResult]:
    """Deploy ``stack_file`` to exactly ``url`` as ``faas-cli deploy -f`` does (PUT, POST on 404).

    Unlike :func:`fedfaas.deploy.deploy`, the URL is not resolved the faas-cli way, so that
    ``OPENFAAS_URL`` or the stack's ``provider.gateway`` never send a local deploy elsewhere.

    Raises
    ------
    PlatformError
        When the stack is invalid or a function is not accepted (the message lists each).
    """
    from fedfaas.deploy import DeployError, DeployResult, GatewayClient
    from fedfaas.stackfile import StackError, load_stack

    try:
        stack = load_stack(stack_file)
    except (StackError, OSError) as exc:
        raise PlatformError(f"cannot deploy: {exc}") from exc
    results: list[DeployResult] = []
    with GatewayClient(url, auth) as client:
        for fn in stack.select(filter):
            try:
                results.append(client.deploy_one(fn.deployment(), replace=replace))
            except httpx.HTTPError as exc:
                results.append(DeployResult(fn.name, 0, "PUT", f"cannot reach {url}: {exc}"))
    if any(not r.ok for r in results):
        raise PlatformError(str(DeployError(results)))
    return results


def deploy_stack(ctx: Context) -> None:
    """Deploy ``ctx.stack_file`` to the runtime and wait until every function has a ready
    replica (the runtime's ``after_start``)."""
    log.info("deploying %s to %s", ctx.stack_file, ctx.url("runtime"))
    deploy_to(ctx.url("runtime"), ctx.basic_auth(), ctx.stack_file)
    wait_ready(ctx, ctx.functions_timeout)


def wait_ready(ctx: Context, timeout: float) -> list[FunctionInfo]:
    """Poll the runtime until every deployed function has a ready replica.

    Raises
    ------
    PlatformError
        Naming the functions that are still not ready after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        fns = list_functions(ctx)
        waiting = [f.name for f in fns if not f.ready]
        if not waiting:
            log.info("functions ready: %s", ", ".join(f.name for f in fns) or "(none)")
            return fns
        if time.monotonic() > deadline:
            raise PlatformError(
                f"functions not ready after {timeout:.0f}s: {', '.join(waiting)}; see "
                f"{ctx.run_dir('runtime')} and {ctx.log_path('runtime')}"
            )
        time.sleep(0.2)

"""The functions of the stack on the embedded runtime: deploy them, wait for them, list them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from core.openfaas import FUNCTION_TOKEN_SECRET, OpenFaaS, OpenFaaSError
from core.stackfile import PLATFORM_STACK, StackError
from fedfaas.deploy import DeployError, deploy
from fedfaas.platform import credentials
from fedfaas.platform.context import Context
from fedfaas.platform.errors import PlatformError

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


def _auth(ctx: Context) -> tuple[str, str]:
    try:
        return ctx.basic_auth()
    except OSError as exc:
        raise PlatformError(f"cannot read the runtime's credentials: {exc}") from exc


def list_functions(ctx: Context, timeout: float = 2.0) -> list[FunctionInfo]:
    """``GET /system/functions`` on the runtime, with the platform's basic auth."""
    try:
        with OpenFaaS(ctx.url("runtime"), _auth(ctx), timeout=timeout, verify=ctx.verify()) as gw:
            body = gw.list_functions()
    except (OpenFaaSError, ValueError) as exc:
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


def store_function_token(ctx: Context) -> None:
    """Create (or refresh) the runtime secret ``fedfaas-function-token`` from the platform's
    ``function-token`` file: every function is deployed with it and checks callers against it."""
    token = credentials.read(ctx.secrets_dir, credentials.FUNCTION_TOKEN)
    try:
        with OpenFaaS(ctx.url("runtime"), _auth(ctx), verify=ctx.verify()) as gw:
            gw.set_secret(FUNCTION_TOKEN_SECRET, token)
    except OpenFaaSError as exc:
        raise PlatformError(f"cannot store the function token in the runtime: {exc}") from exc


#: The platform's functions ``fedfaas up`` deploys from :data:`PLATFORM_STACK` (the cache engine
#: creates the cache functions itself, from ``flstore``'s folder).
PLATFORM_FUNCTIONS = "aggregator"


def deploy_stack(ctx: Context) -> None:
    """Store the function token in the runtime, deploy ``ctx.stack_file`` and the platform's
    ``aggregator`` (:data:`~core.stackfile.PLATFORM_STACK`) to exactly this platform's runtime
    and wait until every function has a ready replica (the runtime's ``after_start``)."""
    store_function_token(ctx)
    log.info("deploying %s and the aggregator to %s", ctx.stack_file, ctx.url("runtime"))
    try:
        url, auth, verify = ctx.url("runtime"), _auth(ctx), ctx.verify()
        deploy(ctx.stack_file, url, auth, resolve=False, verify=verify)
        deploy(PLATFORM_STACK, url, auth, PLATFORM_FUNCTIONS, resolve=False, verify=verify)
    except (DeployError, StackError) as exc:
        raise PlatformError(f"cannot deploy: {exc}") from exc
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
        time.sleep(0.1)

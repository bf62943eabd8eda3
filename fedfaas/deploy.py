"""``fedfaas deploy -f stack.yml``: what ``faas-cli deploy -f stack.yml`` sends, to any gateway.

Per function (reference/openfaas.md section 7): with ``replace``, DELETE ``/system/functions``
first; then PUT the FunctionDeployment, and POST the same body if the PUT answers 404. Only 200 and
202 count as success. ``Authorization`` is Basic when credentials are given, else an empty Bearer
token as faas-cli sends without saved credentials (sent as ``Bearer``: HTTP strips the trailing
space anyway, and h11 refuses to send it).

The requests are :class:`core.openfaas.OpenFaaS`'s, the one gateway client, which also has
the other calls faas-cli makes (list, describe, scale, invoke, remove, logs).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from core.openfaas import DeployResult, OpenFaaS, OpenFaaSError
from core.stackfile import load_stack, resolve_gateway

log = logging.getLogger(__name__)


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


def deploy(
    stack_path: str | Path,
    gateway_url: str | None = None,
    auth: tuple[str, str] | None = None,
    filter: str | None = None,  # noqa: A002 - the faas-cli flag name
    replace: bool = False,
    *,
    resolve: bool = True,
    verify: ssl.SSLContext | bool = True,
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
    verify:
        How an ``https`` gateway is verified (httpx's ``verify``; ``fedfaas up``, TLS by
        default, passes a context with the platform's CA and its own certificate).

    Returns
    -------
    list[DeployResult]
        One per function, in stack-file order.

    Raises
    ------
    DeployError
        A function was not accepted (status other than 200/202); carries every result.
    core.stackfile.StackError
        The stack file is invalid.
    ValueError
        ``resolve=False`` without a ``gateway_url``.
    """
    if not resolve and not gateway_url:
        raise ValueError("deploy(resolve=False) needs the gateway_url to deploy to")
    stack = load_stack(stack_path)
    url = resolve_gateway(gateway_url, stack.gateway) if resolve else str(gateway_url)
    results: list[DeployResult] = []
    with OpenFaaS(url, auth, verify=verify) as client:
        for fn in stack.select(filter):
            try:
                results.append(client.deploy(fn.deployment(), replace=replace))
            except OpenFaaSError as exc:
                results.append(DeployResult(fn.name, 0, "PUT", f"cannot reach {url}: {exc}"))
    if any(not r.ok for r in results):
        raise DeployError(results)
    return results

"""``fedfaas up --openfaas-gateway PATH``: OpenFaaS's own gateway in front of the runtime.

Two parts, started right after the runtime: Debian's Prometheus (:data:`optional.PROMETHEUS`,
on a free loopback port, scraping the gateway's metrics, and the node gateways' when they run)
and the gateway binary at ``PATH``, whose provider is the runtime (``functions_provider_url``),
with the runtime's basic-auth files (``secret_mount_path``: the state folder's secrets). The cache engine, the request tracker and
the control plane then reach functions and ``/system/*`` through the gateway
(:meth:`Context.openfaas_url`), as they would on Kubernetes.

On a TLS platform (``fedfaas up``'s default) the gateway reaches the runtime over HTTPS,
trusting the platform's CA through ``SSL_CERT_FILE``; the gateway itself serves plain HTTP (it
has no TLS setting), and so do its metrics and the Prometheus it reads.

The gateway's ports are fixed upstream: the API on :8080 and its metrics on :8082, on every
interface (it has no listen-address setting), so ``up`` fails when either is taken. ``/system/*``
there needs the basic-auth credentials and every function the function token; the metrics
(``/metrics`` on :8082) need nothing, as upstream.
"""

from __future__ import annotations

from core.services import ServiceError, http_ok
from fedfaas.platform import optional
from fedfaas.platform.context import Context
from fedfaas.platform.parts import PortSpec, ServiceSpec

#: the gateway's fixed ports (OpenFaaS's ``TCPPort`` and metrics port)
GATEWAY_PORT = 8080
METRICS_PORT = 8082
#: how long the gateway waits on a function (of-watchdog's timeouts on Kubernetes)
TIMEOUT = "300s"


def _gateway_argv(ctx: Context) -> list[str]:
    if ctx.openfaas_gateway is None:
        raise ServiceError("no OpenFaaS gateway binary given (fedfaas up --openfaas-gateway)")
    return [str(ctx.openfaas_gateway)]


def _gateway_env(ctx: Context) -> dict[str, str]:
    """The gateway's settings (upstream's environment variables); ``basic_auth`` and
    ``secret_mount_path`` come with :meth:`Context.env`. On a TLS platform the runtime, its
    provider, serves HTTPS: Go trusts the CA that ``SSL_CERT_FILE`` names, so the gateway
    verifies the runtime against the platform's CA (it presents no certificate, which the
    runtime does not require)."""
    tls = {"SSL_CERT_FILE": str(ctx.ca_file)} if ctx.tls else {}
    return {
        **tls,
        "functions_provider_url": f"{ctx.url('runtime')}/",
        "scale_from_zero": "true",
        "faas_prometheus_host": ctx.host,
        "faas_prometheus_port": str(ctx.ports["prometheus"]),
        "read_timeout": TIMEOUT,
        "write_timeout": TIMEOUT,
        "upstream_timeout": TIMEOUT,
    }


OPENFAAS_GATEWAY = ServiceSpec(
    name="openfaas-gateway",
    ports=(
        PortSpec("openfaas_gateway", GATEWAY_PORT, fixed=True),
        PortSpec("openfaas_gateway_metrics", METRICS_PORT, fixed=True),
    ),
    argv=_gateway_argv,
    env=_gateway_env,
    ready=lambda ctx: http_ok(f"{ctx.url('openfaas_gateway')}/healthz"),
    address=lambda ctx: ctx.url("openfaas_gateway"),
    extra=lambda ctx: {"metrics": f"{ctx.url('openfaas_gateway_metrics')}/metrics"},
    depends=("runtime", "prometheus"),
    cwd=lambda ctx: ctx.run_dir("openfaas-gateway"),
    prepare=lambda ctx: ctx.run_dir("openfaas-gateway").mkdir(parents=True, exist_ok=True),
)

#: the parts ``--openfaas-gateway`` adds, in start order
PARTS: list[ServiceSpec] = [optional.PROMETHEUS, OPENFAAS_GATEWAY]

"""Parts that ``fedfaas up --with NAME,...`` adds: the node gateways, the FLStore and LIFL
services, the console, and Debian's Prometheus (``--with prometheus``: not in ``all``). Each is a :class:`ServiceSpec` over the component's own ``python -m`` entry point,
its command line rendered from the component's settings class (:mod:`core.cmdline`).

Secrets reach them as the PATHS of the state folder's secret files (mode 0600), never as values
on the command line (where ``ps`` would show them) or in the environment; each part gets only
its own files (its MinIO and Redis users, its tokens).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from cache_engine.settings import EngineSettings
from console.settings import ConsoleSettings
from control_plane.settings import ControlPlaneSettings
from core.services import PrometheusServer
from fedfaas.platform import credentials
from fedfaas.platform.context import Context
from fedfaas.platform.nodes import (
    NODES,
    PORT_OF,
    gateway_nodes,
    router_socket,
    shm_root,
    socket_dir,
)
from fedfaas.platform.parts import PortSpec, ServiceSpec, minio_credentials, redis_credentials
from gateway.settings import GatewaySettings
from request_tracker.settings import TrackerSettings

#: Ports of the optional parts (the components' own defaults).
OPTIONAL_PORTS = {
    "gateway": 8081,
    "gateway_node1": 8082,
    "cache_engine": 8091,
    "request_tracker": 8092,
    "control_plane": 8070,
    "console": 8060,
}


def _redis_url(ctx: Context) -> str:
    return f"{ctx.url('redis', 'redis')}/0"


def _minio_endpoint(ctx: Context) -> str:
    return f"{ctx.host}:{ctx.ports['minio']}"


def _healthz(port_name: str) -> Callable[[Context], bool]:
    return lambda ctx: ctx.http_ok(f"{ctx.url(port_name)}/healthz")


def admin_secret(ctx: Context) -> Path:
    """The admin secret every node gateway shares (client tokens verify on any node) and the
    control plane sends; created by the first gateway."""
    return ctx.secrets_dir / "gateway-admin-secret"


def token_file(ctx: Context, name: str) -> Path:
    """The path of bearer-token secret ``name`` (``credentials.ADMIN_TOKEN``, ...)."""
    return ctx.secrets_dir / name


def _cleanup_node_files(ctx: Context) -> None:
    shutil.rmtree(shm_root(ctx), ignore_errors=True)
    shutil.rmtree(socket_dir(ctx), ignore_errors=True)


def gateway_settings(ctx: Context, node: str) -> GatewaySettings:
    """The settings of ``node``'s gateway on this platform (rendered by ``to_argv``)."""
    nodes = gateway_nodes(ctx)
    return GatewaySettings(
        node=node,
        host=ctx.host,
        port=ctx.ports[PORT_OF[node]],
        state_dir=ctx.run_dir(f"gateway-{node}"),
        redis_url=_redis_url(ctx),
        redis_credentials_file=redis_credentials(ctx, "gateway"),
        shm_root=shm_root(ctx),
        router_socket=router_socket(ctx, node),
        admin_secret_file=admin_secret(ctx),
        peers={n: url for n, url in nodes.items() if n != node},
        minio_endpoint=_minio_endpoint(ctx),
        minio_credentials_file=minio_credentials(ctx, "gateway"),
        # with the FLStore parts up, completed rounds flow into the cache engine
        engine_url=ctx.url("cache_engine") if "cache_engine" in ctx.ports else None,
        engine_token_file=token_file(ctx, credentials.SERVICE_TOKEN),
        **ctx.tls_settings(f"gateway-{node}"),
        tls_internal_names=internal_callers(ctx),
    )


def internal_callers(ctx: Context) -> str:
    """The parts whose certificates open a gateway's internal routes on a TLS platform
    (:mod:`gateway.callers`): the control plane and the node gateways, not ``functions`` (a
    replica's code can read its key) nor ``fedfaas``; ``""`` without TLS."""
    return ",".join(["control-plane", *(f"gateway-{n}" for n in NODES)]) if ctx.tls else ""


def _prepare_gateway(node: str) -> Callable[[Context], None]:
    def prepare(ctx: Context) -> None:
        ctx.run_dir(f"gateway-{node}").mkdir(parents=True, exist_ok=True)
        socket_dir(ctx).mkdir(mode=0o700, parents=True, exist_ok=True)

    return prepare


def gateway_router(ctx: Context, timeout: float = 5.0) -> tuple[str, str] | None:
    """The router mode the running node gateway reports, or ``None`` if it does not answer."""
    try:
        url, tls = f"{ctx.url('gateway')}/healthz", ctx.client_ssl()
        with urllib.request.urlopen(url, timeout=timeout, context=tls) as r:
            body = json.loads(r.read())
        return str(body["router"]), f"node gateway: {body.get('router_reason', '')}"
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None


def _gateway(node: str, name: str, depends: tuple[str, ...]) -> ServiceSpec:
    port = PORT_OF[node]
    return ServiceSpec(
        name=name,
        ports=(PortSpec(port, OPTIONAL_PORTS[port]),),
        argv=lambda ctx: gateway_settings(ctx, node).to_argv(),
        ready=_healthz(port),
        address=lambda ctx: ctx.url(port),
        extra=lambda ctx: {
            "node": node,
            "shm": str(shm_root(ctx)),
            "router_socket": str(router_socket(ctx, node)),
        },
        depends=depends,
        prepare=_prepare_gateway(node),
        cleanup=_cleanup_node_files,
    )


#: ``--with gateway``: two node gateways (node0, node1); the second starts after the first has
#: written the shared admin secret.
GATEWAY = _gateway("node0", "gateway", ("minio", "redis", "runtime"))
GATEWAY_NODE1 = _gateway("node1", "gateway-node1", ("gateway",))


def engine_settings(ctx: Context) -> EngineSettings:
    """The cache engine's settings on this platform."""
    return EngineSettings(
        host=ctx.host,
        port=ctx.ports["cache_engine"],
        redis_url=_redis_url(ctx),
        redis_credentials_file=redis_credentials(ctx, "cache-engine"),
        minio_endpoint=_minio_endpoint(ctx),
        minio_credentials_file=minio_credentials(ctx, "cache-engine"),
        runtime_url=ctx.openfaas_url(),
        runtime_auth_dir=str(ctx.secrets_dir),
        admin_token_file=token_file(ctx, credentials.ADMIN_TOKEN),
        service_token_file=token_file(ctx, credentials.SERVICE_TOKEN),
        function_token_file=token_file(ctx, credentials.FUNCTION_TOKEN),
        # the node gateways' store counts against the node's one memory budget
        store_root=shm_root(ctx),
        **ctx.tls_settings("cache-engine"),
    )


CACHE_ENGINE = ServiceSpec(
    name="cache-engine",
    ports=(PortSpec("cache_engine", OPTIONAL_PORTS["cache_engine"]),),
    argv=lambda ctx: engine_settings(ctx).to_argv(),
    ready=_healthz("cache_engine"),
    address=lambda ctx: ctx.url("cache_engine"),
    depends=("minio", "redis", "runtime"),
)

REQUEST_TRACKER = ServiceSpec(
    name="request-tracker",
    ports=(PortSpec("request_tracker", OPTIONAL_PORTS["request_tracker"]),),
    argv=lambda ctx: TrackerSettings(
        host=ctx.host,
        port=ctx.ports["request_tracker"],
        redis_url=_redis_url(ctx),
        redis_credentials_file=redis_credentials(ctx, "request-tracker"),
        engine_url=ctx.url("cache_engine"),
        runtime_url=ctx.openfaas_url(),
        admin_token_file=token_file(ctx, credentials.ADMIN_TOKEN),
        analyst_token_file=token_file(ctx, credentials.ANALYST_TOKEN),
        engine_token_file=token_file(ctx, credentials.SERVICE_TOKEN),
        function_token_file=token_file(ctx, credentials.FUNCTION_TOKEN),
        **ctx.tls_settings("request-tracker"),
    ).to_argv(),
    ready=_healthz("request_tracker"),
    address=lambda ctx: ctx.url("request_tracker"),
    depends=("redis", "runtime", "cache-engine"),
)

CONTROL_PLANE = ServiceSpec(
    name="control-plane",
    ports=(PortSpec("control_plane", OPTIONAL_PORTS["control_plane"]),),
    argv=lambda ctx: ControlPlaneSettings(
        host=ctx.host,
        port=ctx.ports["control_plane"],
        gateways=",".join(f"{n}={url}" for n, url in gateway_nodes(ctx).items()),
        admin_token_file=admin_secret(ctx),
        analyst_token_file=token_file(ctx, credentials.ANALYST_TOKEN),
        redis_url=_redis_url(ctx),
        redis_credentials_file=redis_credentials(ctx, "control-plane"),
        provider_url=ctx.openfaas_url(),
        provider_auth_dir=ctx.secrets_dir,
        # jobs with selection="oort" ask FLStore's tracker, when this platform runs one
        tracker_url=ctx.url("request_tracker") if "request_tracker" in ctx.ports else "",
        tracker_token_file=(
            token_file(ctx, credentials.ANALYST_TOKEN) if "request_tracker" in ctx.ports else None
        ),
        **ctx.tls_settings("control-plane"),
    ).to_argv(),
    ready=_healthz("control_plane"),
    address=lambda ctx: ctx.url("control_plane"),
    depends=("redis", "runtime", "gateway", "gateway-node1"),
)

CONSOLE = ServiceSpec(
    name="console",
    ports=(PortSpec("console", OPTIONAL_PORTS["console"]),),
    argv=lambda ctx: ConsoleSettings(
        host=ctx.host,
        port=ctx.ports["console"],
        control_plane_url=ctx.url("control_plane"),
        tracker_url=ctx.url("request_tracker"),
        runtime_url=ctx.openfaas_url(),
        gateways=",".join(f"{n}={url}" for n, url in gateway_nodes(ctx).items()),
        minio_endpoint=_minio_endpoint(ctx),
        minio_console_url=ctx.url("minio_console"),
        admin_token_file=admin_secret(ctx),
        analyst_token_file=token_file(ctx, credentials.ANALYST_TOKEN),
        # the cache engine's MinIO user: list and read the bucket, nothing else
        minio_credentials_file=minio_credentials(ctx, "cache-engine"),
        runtime_auth_dir=ctx.secrets_dir,
        # the data plane's rates from the platform's Prometheus when it runs one
        prometheus_url=ctx.url("prometheus") if "prometheus" in ctx.ports else "",
        secure_cookie=ctx.tls,  # served over HTTPS: the browser sends it only there
        **ctx.tls_settings("console"),
    ).to_argv(),
    ready=_healthz("console"),
    address=lambda ctx: ctx.url("console"),
    depends=("control-plane", "request-tracker"),
)


def prometheus_server(ctx: Context) -> PrometheusServer:
    """The platform's Prometheus: it scrapes OpenFaaS's gateway (``--openfaas-gateway``: its
    function counts) and the node gateways (their admin secret as the bearer token, read
    from its file at each scrape), whichever of them run. On a TLS platform it scrapes the
    node gateways over https, verifying them against the platform's CA and presenting
    ``fedfaas``'s certificate (Prometheus itself serves plain HTTP, on loopback)."""
    gateways = [url.split("://", 1)[1] for url in gateway_nodes(ctx).values()]
    openfaas = ctx.ports.get("openfaas_gateway_metrics")
    tls = ctx.tls_dir
    return PrometheusServer(
        data_dir=ctx.data_dir("prometheus"),
        host=ctx.host,
        port=ctx.ports["prometheus"],
        targets=[f"127.0.0.1:{openfaas}"] if openfaas else [],
        bearer_targets=gateways,
        bearer_file=admin_secret(ctx),
        bearer_tls=(ctx.ca_file, tls / "fedfaas.crt", tls / "fedfaas.key") if ctx.tls else None,
    )


#: ``--with prometheus`` (and ``--openfaas-gateway``): Debian's Prometheus on a free loopback
#: port (Debian's own service takes 9090 where it runs); the console then takes the data
#: plane's rates from it
PROMETHEUS = ServiceSpec(
    name="prometheus",
    ports=(PortSpec("prometheus", 0),),
    argv=lambda ctx: prometheus_server(ctx).command(),
    ready=lambda ctx: prometheus_server(ctx).ready(),
    address=lambda ctx: ctx.url("prometheus"),
    prepare=lambda ctx: prometheus_server(ctx).prepare(),
)

#: Parts that come with another: ``--with gateway`` starts a gateway on each of :data:`NODES`.
COMPANIONS = {"gateway": ("gateway-node1",)}

#: Optional parts by name, in start order; ``--with all`` takes all but :data:`NOT_IN_ALL`.
OPTIONAL: dict[str, ServiceSpec] = {
    p.name: p
    for p in (
        GATEWAY,
        GATEWAY_NODE1,
        CACHE_ENGINE,
        REQUEST_TRACKER,
        CONTROL_PLANE,
        PROMETHEUS,
        CONSOLE,
    )
}
#: Parts only named ones start: the console's own rates serve without a Prometheus
NOT_IN_ALL = frozenset({"prometheus"})


def resolve(names: Iterable[str]) -> list[ServiceSpec]:
    """The optional parts called ``names`` (``"all"`` for every one but :data:`NOT_IN_ALL`)
    and those they depend on, in :data:`OPTIONAL`'s order.

    Raises
    ------
    KeyError
        Naming the unknown part.
    """
    names = list(names)
    for name in names:
        if name != "all" and name not in OPTIONAL:
            raise KeyError(name)
    every = "all" in names
    wanted = [n for n in OPTIONAL if n in names or (every and n not in NOT_IN_ALL)]
    out: list[ServiceSpec] = []

    def add(name: str) -> None:
        if name not in OPTIONAL:
            raise KeyError(name)
        spec = OPTIONAL[name]
        if spec in out:
            return
        for dep in spec.depends:
            if dep in OPTIONAL:
                add(dep)
        out.append(spec)
        for companion in COMPANIONS.get(name, ()):
            add(companion)

    for name in wanted:
        add(name)
    return out

"""The parts of a node, in start order: what runs, on which ports, and how to tell it is ready.

Adding a part is one :class:`ServiceSpec` in :data:`PARTS` (always started) or in
:data:`fedfaas.platform.optional.OPTIONAL` (started with ``fedfaas up --with NAME``), e.g.::

    ServiceSpec(
        name="gateway",
        ports=(PortSpec("gateway", 8081),),
        argv=lambda ctx: GatewaySettings(port=ctx.ports["gateway"]).to_argv(),
        ready=lambda ctx: http_ok(ctx.url("gateway") + "/healthz"),
        address=lambda ctx: ctx.url("gateway"),
        depends=("redis", "minio", "runtime"),
    )

Every part gets :meth:`Context.env` (where Redis, MinIO and the runtime are) in its environment.
Command lines come from the components' settings classes (:mod:`core.cmdline`), never by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.services import MinioServer, RedisServer, http_ok, redis_ping
from core.stackfile import PLATFORM_STACK
from fedfaas.platform import functions
from fedfaas.platform.context import Context
from fedfaas.platform.nodes import gateway_nodes, router_socket
from fedfaas.settings import DEFAULT_PORTS
from runtime.settings import RuntimeSettings


@dataclass(frozen=True)
class PortSpec:
    """A port a part listens on: its name (the key in ``Context.ports``) and usual number;
    a ``fixed`` one (a program that cannot listen elsewhere) is that number or ``up`` fails."""

    name: str
    default: int
    fixed: bool = False


def _nothing(ctx: Context) -> None:
    return None


def _no_env(ctx: Context) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one part of the platform.

    Attributes
    ----------
    name
        Short name, used in ``status``, logs (``logs/<name>.log``) and ``depends``.
    ports
        Ports to choose before the part starts (see ``fedfaas.settings`` for the rule).
    argv
        Builds the command line from the context (ports are chosen by then).
    ready
        One non-blocking readiness probe; ``up`` polls it until it is true.
    address
        What ``status`` shows as the part's address.
    depends
        Parts that must be ready first.
    env
        Extra environment for this part, on top of ``Context.env()``.
    extra
        More addresses for ``status`` (a console, a socket path).
    prepare
        Runs before the part starts (folders, config files).
    after_start
        Runs once the part is ready (the runtime deploys the stack here).
    cleanup
        Runs in ``down`` after every process is gone (e.g. remove /dev/shm namespaces).
    cwd
        Working folder of the process (default: the state folder).
    """

    name: str
    ports: tuple[PortSpec, ...]
    argv: Callable[[Context], list[str]]
    ready: Callable[[Context], bool]
    address: Callable[[Context], str]
    depends: tuple[str, ...] = ()
    env: Callable[[Context], dict[str, str]] = _no_env
    extra: Callable[[Context], dict[str, str]] = _no_env
    prepare: Callable[[Context], None] = _nothing
    after_start: Callable[[Context], None] = _nothing
    cleanup: Callable[[Context], None] = _nothing
    cwd: Callable[[Context], Path] | None = None
    start_timeout: float | None = field(default=None)


# --- MinIO -------------------------------------------------------------------------------------


def _minio(ctx: Context) -> MinioServer:
    """MinIO with its root credentials and its users' credentials files in the secrets folder."""
    return MinioServer(
        data_dir=ctx.data_dir("minio"),
        host=ctx.host,
        port=ctx.ports["minio"],
        console_port=ctx.ports["minio_console"],
        secrets_dir=ctx.secrets_dir,
    )


def minio_credentials(ctx: Context, user: str) -> Path:
    """The MinIO credentials file of component ``user`` (``gateway``, ``cache-engine``)."""
    return MinioServer(
        data_dir=ctx.data_dir("minio"), secrets_dir=ctx.secrets_dir
    ).credentials_file(user)


def _redis(ctx: Context) -> RedisServer:
    """Redis with its ACL users' credentials files in the secrets folder."""
    return RedisServer(
        data_dir=ctx.data_dir("redis"),
        host=ctx.host,
        port=ctx.ports["redis"],
        secrets_dir=ctx.secrets_dir,
    )


def redis_credentials(ctx: Context, user: str) -> Path:
    """The Redis credentials file of ACL user ``user`` (``gateway``, ``cache-engine``, ...)."""
    return RedisServer(
        data_dir=ctx.data_dir("redis"), secrets_dir=ctx.secrets_dir
    ).credentials_file(user)


def _minio_ready(ctx: Context) -> bool:
    return http_ok(f"{ctx.url('minio')}/minio/health/ready") and http_ok(ctx.url("minio_console"))


MINIO = ServiceSpec(
    name="minio",
    ports=(
        PortSpec("minio", DEFAULT_PORTS["minio"]),
        PortSpec("minio_console", DEFAULT_PORTS["minio_console"]),
    ),
    argv=lambda ctx: _minio(ctx).command(),
    env=lambda ctx: _minio(ctx).environment(),
    ready=_minio_ready,
    address=lambda ctx: ctx.url("minio"),
    extra=lambda ctx: {"console": ctx.url("minio_console")},
    prepare=lambda ctx: _minio(ctx).prepare(),
    # the bucket, and one user per component with a policy on it
    after_start=lambda ctx: _minio(ctx).provision(),
)

# --- Redis -------------------------------------------------------------------------------------

REDIS = ServiceSpec(
    name="redis",
    ports=(PortSpec("redis", DEFAULT_PORTS["redis"]),),
    argv=lambda ctx: _redis(ctx).command(),
    ready=lambda ctx: redis_ping(ctx.host, ctx.ports["redis"]),
    address=lambda ctx: f"{ctx.url('redis', 'redis')}/0",
    # redis.conf (0600): the default user off, one ACL user per component
    prepare=lambda ctx: _redis(ctx).prepare(),
)

# --- The embedded OpenFaaS-compatible runtime ----------------------------------------------------


def _runtime_argv(ctx: Context) -> list[str]:
    """The runtime's command line; with node gateways up (``--with gateway``) it places each
    function replica on one of their nodes (``RuntimeSettings.nodes``). Its asynchronous calls
    are queued in the platform's Redis, as its ACL user ``runtime``."""
    return RuntimeSettings(
        host=ctx.host,
        port=ctx.ports["runtime"],
        stack=ctx.stack_file,
        platform_stack=PLATFORM_STACK,
        state_dir=ctx.run_dir("runtime"),
        auth_dir=ctx.secrets_dir,
        nodes={n: router_socket(ctx, n) for n in gateway_nodes(ctx)},
        redis_url=f"{ctx.url('redis', 'redis')}/0",
        redis_credentials_file=redis_credentials(ctx, "runtime"),
        behind_gateway=ctx.openfaas_gateway is not None,
        **ctx.tls_settings("runtime"),
        **ctx.function_tls_settings(),
    ).to_argv()


RUNTIME = ServiceSpec(
    name="runtime",
    ports=(PortSpec("runtime", DEFAULT_PORTS["runtime"]),),
    argv=_runtime_argv,
    ready=lambda ctx: ctx.http_ok(f"{ctx.url('runtime')}/healthz"),
    address=lambda ctx: ctx.url("runtime"),
    depends=("minio", "redis"),
    prepare=lambda ctx: ctx.run_dir("runtime").mkdir(parents=True, exist_ok=True),
    after_start=functions.deploy_stack,
    cwd=lambda ctx: ctx.stack_file.parent,
)

#: The parts of a node, in start order (``down`` stops them in reverse).
PARTS: list[ServiceSpec] = [MINIO, REDIS, RUNTIME]

# --- The supervisor ------------------------------------------------------------------------------

#: Started last by ``fedfaas up`` (stopped first by ``down``): starts again any part whose process
#: dies, as a kubelet does for a pod (:mod:`fedfaas.platform.supervisor`).
SUPERVISOR = ServiceSpec(
    name="supervisor",
    ports=(),
    argv=lambda ctx: [
        sys.executable,
        "-m",
        "fedfaas.platform.supervisor",
        "--state-dir",
        str(ctx.state_dir),
    ],
    ready=lambda ctx: True,
    address=lambda ctx: "-",
)


def ordered(parts: list[ServiceSpec]) -> list[ServiceSpec]:
    """``parts`` in an order where each comes after what it depends on (stable otherwise).

    Raises
    ------
    ValueError
        On a dependency that is not in ``parts`` or on a cycle.
    """
    by_name = {p.name: p for p in parts}
    if len(by_name) != len(parts):
        raise ValueError("two parts share a name")
    out: list[ServiceSpec] = []
    seen: set[str] = set()
    visiting: set[str] = set()

    def visit(p: ServiceSpec) -> None:
        if p.name in seen:
            return
        if p.name in visiting:
            raise ValueError(f"dependency cycle through {p.name}")
        visiting.add(p.name)
        for dep in p.depends:
            if dep not in by_name:
                raise ValueError(f"{p.name} depends on unknown part {dep}")
            visit(by_name[dep])
        visiting.discard(p.name)
        seen.add(p.name)
        out.append(p)

    for p in parts:
        visit(p)
    return out

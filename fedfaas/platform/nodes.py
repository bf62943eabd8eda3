"""Where a platform's node gateways are: their names, the port each is reached on, their
router sockets and their object-store root. The optional parts start them
(:mod:`fedfaas.platform.optional`); the embedded runtime places function replicas on them
(:mod:`fedfaas.platform.parts`)."""

from __future__ import annotations

from pathlib import Path

from fedfaas.platform.context import Context

#: The nodes of ``--with gateway``: one node gateway each, with the port named in ``PORT_OF``.
NODES = ("node0", "node1")
PORT_OF = {"node0": "gateway", "node1": "gateway_node1"}


def shm_root(ctx: Context) -> Path:
    """This platform's object-store root in its ``shm_dir`` (``/dev/shm`` unless ``up`` was
    given ``--shm-dir``; removed by ``down``)."""
    return ctx.shm_dir / f"fedfaas-{ctx.platform_id[:12]}"


def socket_dir(ctx: Context) -> Path:
    """Where the node gateways' router sockets live (short: a socket path has 108 bytes)."""
    return Path("/tmp") / f"fedfaas-{ctx.platform_id[:12]}"


def router_socket(ctx: Context, node: str) -> Path:
    """The router socket of ``node``'s gateway: the ``aggregator`` replicas placed on ``node``
    get it as ``FEDFAAS_GATEWAY_ROUTER_SOCKET`` from the runtime."""
    return socket_dir(ctx) / f"{node}.sock"


def gateway_nodes(ctx: Context) -> dict[str, str]:
    """The node gateways of this platform, node name -> URL (empty without ``--with gateway``)."""
    return {n: ctx.url(PORT_OF[n]) for n in NODES if PORT_OF[n] in ctx.ports}

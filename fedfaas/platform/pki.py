"""The certificates of a platform started with ``fedfaas up`` (TLS, its default): a local CA
and one certificate per part, minted into ``STATE_DIR/secrets/tls`` (0600 files, removed by
``down`` with the other secrets; the CA's key is deleted once they are signed) by
:func:`core.tls.mint_ca` and :func:`core.tls.mint_cert`.

Each certificate names the platform's loopback host (and ``localhost``), is valid as a server
and as a client, and is that part's alone: the part serves HTTPS with it and presents it when
it calls the others (mTLS). ``fedfaas`` itself has one too, for its probes and deploys, and
the runtime's function replicas share ``functions``: each serves HTTPS with it on loopback and
presents it when it calls the platform (another replica, the runtime).
"""

from __future__ import annotations

import logging

from core.tls import mint_ca, mint_cert
from fedfaas.platform.context import Context

log = logging.getLogger(__name__)

#: the parts that get a certificate: every one that serves HTTPS, ``fedfaas`` (the CLI) and the
#: function replicas
CERTIFIED = (
    "runtime",
    "gateway-node0",
    "gateway-node1",
    "cache-engine",
    "request-tracker",
    "control-plane",
    "console",
    "fedfaas",
    "functions",
)


def mint(ctx: Context) -> None:
    """A new CA and every part's certificate in :attr:`Context.tls_dir` (a 0700 folder)."""
    ctx.tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ctx.tls_dir.chmod(0o700)
    ca = mint_ca(ctx.tls_dir, name=f"FedFaaS platform {ctx.platform_id[:12]} CA")
    hosts = list(dict.fromkeys([ctx.host, "127.0.0.1", "localhost"]))
    for part in CERTIFIED:
        # a node gateway's certificate also names its node: what discovery checks
        node = [part.removeprefix("gateway-")] if part.startswith("gateway-") else []
        mint_cert(ca, ctx.tls_dir, part, [*hosts, *node])
    ca.key.unlink()  # nothing signs after up: the CA's key does not stay on disk
    log.info("TLS: CA and %d certificates in %s", len(CERTIFIED), ctx.tls_dir)

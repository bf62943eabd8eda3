"""A round aggregated by a real in-process gateway and read back through FLStore.

The tests that follow a round from the gateway into the cache engine share these steps: a
gateway wired to a stack's MinIO and engine, and one round of :data:`CLIENTS` (aggregated by one
replica of the aggregator function); :mod:`tests.flstore.tracker_queries` asks about it.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from bench.harness.flstore_stack import FLStoreStack
from core.auth import bearer
from core.services import MinioServer
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread
from tests.dataplane.rounds import post_update, wait_version

CLIENTS = ["c0", "c1", "c2", "c3"]


def stack_gateway(
    make_gw: Callable[..., GatewayThread],
    stack: FLStoreStack,
    minio_server: MinioServer,
    **settings: object,
) -> GatewayThread:
    """A gateway (``make_gw``, with ``settings``) whose rounds go to ``stack``'s MinIO bucket
    and are offered to its cache engine."""
    return make_gw(
        minio_endpoint=minio_server.endpoint,
        minio_credentials_file=minio_server.credentials_file("gateway"),
        engine_url=stack.engine_url,
        engine_token_file=stack.token_file("service"),
        **settings,
    )


def one_round(
    gw: GatewayThread, job: str, base: bytes, update: Callable[[str], bytes]
) -> dict[str, str]:
    """Create ``job`` (2 rounds, goal 4, :data:`CLIENTS`) from model ``base``, send each
    client's ``update(client)`` (in the order of :data:`CLIENTS`) to round 1, and wait until
    the gateway serves its global model; the clients' tokens."""
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": job, "rounds": 2, "goal": 4, "clients": ",".join(CLIENTS)},
        content=base,
        headers=bearer(gw.gw.secret),
    )
    assert r.status_code == 201, r.text
    tokens: dict[str, str] = r.json()["tokens"]
    aggs = Aggregators(gw)
    try:
        aggs.start(1)
        for c in CLIENTS:
            up = post_update(gw.url, job, 1, tokens[c], c, update(c), 10)
            assert up.status_code == 202, up.text
        wait_version(gw.url, tokens["c0"], 1, job=job)
    finally:
        aggs.stop()
    return tokens

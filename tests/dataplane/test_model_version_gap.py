"""A root node journals a new model version before it serves it (``gateway.publish``: the journal
write, then ``job.version`` and ``model_bytes``). A non-root node that reads the new version from
the journal in that gap knows the version but cannot fetch its bytes yet: it must never answer a
model read with a 200 that lacks them (issue 35: node b answered ``X-Model-Version: 1`` and an
empty body, and a client failed to parse it). It answers 503 ``unavailable`` with
``Retry-After`` and says it is fetching the version; the SDK asks again; its background prefetch fetches again until it has them.

The gap is widened at a named point: the root's ``journal.publish`` returns only once the test
lets it (real gateways, Redis and aggregator replicas otherwise)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.node import FLClient, GlobalModel
from core import wire
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread
from tests.dataplane.rounds import assert_fedavg, create, expected, upload
from tests.polling import wait_until

pytestmark = pytest.mark.integration


class PublishGate:
    """Holds the root's ``journal.publish`` after its write until :attr:`release` is set: the
    journal names the new version, the root still serves the one before."""

    def __init__(self, journal: Any) -> None:
        self.written = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._publish = journal.publish
        journal.publish = self._held

    async def _held(self, *args: Any, **kw: Any) -> None:
        await self._publish(*args, **kw)
        self.written.set()
        await asyncio.to_thread(self.release.wait, 60)


@contextmanager
def _root_and_node(
    make_gw, tmp_path: Path, clients: list[str]
) -> Iterator[tuple[GatewayThread, GatewayThread, dict]]:  # type: ignore[no-untyped-def]
    """Root ``a`` and node ``b``, job ``j1`` (2 rounds, goal 2) over both, one replica each."""
    shared = tmp_path / "admin-secret"
    a = make_gw(node="a", fanout=2, pool=3, admin_secret_file=shared)
    b = make_gw(node="b", fanout=2, pool=3, peers={"a": a.url}, admin_secret_file=shared)
    info = create(a, clients, 2, rounds=2, nodes="a,b")
    wait_until(lambda: "j1" in b.gw.jobs, 30, "node b loads job j1")
    aggs = [Aggregators(a), Aggregators(b)]
    try:
        for agg in aggs:
            agg.start(1)
        yield a, b, info
    finally:
        for agg in aggs:
            agg.stop()


def _logged(caplog: pytest.LogCaptureFixture, logger: str, says: str) -> bool:
    return any(r.name == logger and says in r.getMessage() for r in list(caplog.records))


def test_non_root_node_never_serves_a_journaled_version_without_its_bytes(
    make_gw, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    clients = ["c0", "c1"]
    with _root_and_node(make_gw, tmp_path, clients) as (a, b, info):
        gate = PublishGate(a.gw.journal)
        tokens, node_of = info["tokens"], info["plan"]["client_nodes"]
        on_a = next(c for c in clients if node_of[c] == "a")
        on_b = next(c for c in clients if node_of[c] == "b")
        url = {"a": a.url, "b": b.url}
        job_b = b.gw.jobs["j1"]
        try:
            # round 1: the root journals v1 and is held before it serves it
            gate.release.clear()
            for c, seed in ((on_a, 1), (on_b, 2)):
                upload(url[node_of[c]], tokens, c, 1, seed, 1)
            wait_until(gate.written.is_set, 60, "the root journals version 1")
            wait_until(lambda: job_b.version == 1, 30, "node b reads version 1 from the journal")
            assert a.gw.jobs["j1"].version == 0  # the root still serves v0
            r = httpx.get(
                f"{b.url}/v1/jobs/j1/model", headers={"Authorization": f"Bearer {tokens[on_b]}"}
            )
            assert r.status_code == 503, (
                f"{r.status_code} X-Model-Version {r.headers.get('x-model-version')} with "
                f"{len(r.content)} bytes"
            )
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"] == "unavailable"
            assert "is fetching model version 1" in r.json()["detail"]

            # the SDK asks again after the Retry-After, and gets v1 once the root serves it
            got: list[GlobalModel | BaseException] = []

            def read() -> None:
                try:
                    with FLClient(b.url, "j1", on_b, tokens[on_b]) as sdk:
                        got.append(sdk.wait_for_version(1, timeout=60))
                except BaseException as exc:  # reported below
                    got.append(exc)

            reader = threading.Thread(target=read, name="sdk-reader")
            reader.start()
            wait_until(
                lambda: _logged(caplog, "client.node", "is fetching model version 1") or got,
                30,
                "the SDK is answered 503 and asks again",
            )
            gate.release.set()
            reader.join(90)
            assert len(got) == 1 and isinstance(got[0], GlobalModel), got
            assert got[0].version == 1
            assert_fedavg(wire.decode_tensors(got[0].data), expected([1, 2], [1, 1]))

            # round 2: nobody reads the model on b; its background prefetch, answered v1 by
            # the held root, fetches again until it holds v2
            gate.written.clear()
            gate.release.clear()
            for c, seed in ((on_a, 3), (on_b, 4)):
                upload(url[node_of[c]], tokens, c, 2, seed, 1)
            wait_until(gate.written.is_set, 60, "the root journals version 2")
            wait_until(lambda: job_b.version == 2, 30, "node b reads version 2 from the journal")
            wait_until(
                lambda: _logged(caplog, "gateway.membership", "does not serve model v2 yet"),
                30,
                "node b's prefetch is answered v1 and fetches again",
            )
            assert not job_b.model_bytes
            gate.release.set()
            fetched = wait_until(
                lambda: bytes(job_b.model_bytes), 30, "node b's prefetch holds model v2"
            )
            assert job_b.version == 2
            assert_fedavg(wire.decode_tensors(fetched), expected([3, 4], [1, 1]))
        finally:
            gate.release.set()

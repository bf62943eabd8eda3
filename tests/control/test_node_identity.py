"""A node address that a gateway of another node answers (two nodes configured at one address,
a port taken by another node's gateway: the CI flake of issue 35) is kept out of placement at
once, with an error naming both nodes, instead of a job creation timing out 30 s later on a
job "not known there". A real gateway (node ``n1``) answers at the address."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from control_plane.coordinator import Coordinator
from control_plane.errors import NoHealthyNodes
from control_plane.jobs import JobSpec
from control_plane.store import MemoryStore
from core import wire
from tests.dataplane.gwutil import GatewayThread, settings, tiny_model

pytestmark = pytest.mark.integration


@pytest.fixture()
def n1(tmp_path: Path, redis_url: str) -> Iterator[GatewayThread]:
    gw = GatewayThread(settings(tmp_path, redis_url, node="n1")).start()
    try:
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(gw.settings.shm_root, ignore_errors=True)


def test_an_address_answered_by_another_nodes_gateway_is_out_of_placement_at_once(
    n1: GatewayThread, caplog: pytest.LogCaptureFixture
) -> None:
    # n2 configured at n1's address; n1 itself at it too (two nodes at one address)
    coord = Coordinator(
        {"n1": n1.url, "n2": n1.url},
        store=MemoryStore(),
        admin_token=n1.gw.secret,
        health_failures=1,
    )
    caplog.set_level(logging.ERROR, logger="control_plane")

    async def run() -> None:
        try:
            health = await coord.check_health()
            assert health == {"n1": True, "n2": False}
            assert coord.healthy_nodes() == ["n1"]
            said = [r.message for r in caplog.records if "answers as node n1" in r.message]
            assert len(said) == 1 and said[0].startswith("node n2: the gateway at")
            await coord.check_health()  # said once, not at every probe
            assert len([r for r in caplog.records if "answers as node n1" in r.message]) == 1
            # a job goes to n1 alone: nothing waits on n2's address
            spec = JobSpec("j", rounds=1, goal=2, clients=["a", "b"])
            body = wire.encode_tensors(tiny_model(0))
            job = await coord.create_job(spec, initial_weights=body, open_first_round=False)
            assert job.root == "n1"
        finally:
            await coord.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    r = httpx.get(f"{n1.url}/v1/jobs/j", headers={"Authorization": f"Bearer {n1.gw.secret}"})
    assert r.status_code == 200 and r.json()["nodes"] == ["n1"]


def test_no_node_answering_as_itself_refuses_a_job_at_once(n1: GatewayThread) -> None:
    coord = Coordinator(
        {"n2": n1.url}, store=MemoryStore(), admin_token=n1.gw.secret, health_failures=1
    )

    async def run() -> None:
        try:
            assert await coord.check_health() == {"n2": False}
            spec = JobSpec("j", rounds=1, goal=2, clients=["a", "b"])
            with pytest.raises(NoHealthyNodes):
                await coord.create_job(spec, initial_weights=wire.encode_tensors(tiny_model(0)))
        finally:
            await coord.stop()

    asyncio.run(asyncio.wait_for(run(), 60))

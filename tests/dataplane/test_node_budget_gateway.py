"""The node gateway under the node's one memory budget (``node_memory_bytes``).

The budget covers every store under the gateway's ``shm_root`` (two gateways of one machine
share it): here another node's store is a ballast file the test sizes from what the stores hold.
An upload that lands in a pre-faulted buffer takes no new memory and is accepted; one that
needs a new buffer past the budget is answered 503 ``store_full`` with ``Retry-After`` and a
JSON body, nothing kept; the SDK sends it again, and once there is room it counts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from cache_engine.node_memory import store_bytes
from client.sdk import FLClient, UploadReceipt
from core import wire
from tests.dataplane.gwutil import GatewayThread
from tests.dataplane.rounds import post_update
from tests.polling import wait_until

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1"]
MIB = 1 << 20
BUDGET = 64 * MIB


def _model(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return wire.encode_tensors({"w": rng.standard_normal((256, 1024)).astype(np.float32)})


def _create(gw: GatewayThread) -> dict[str, str]:
    """Job ``j1`` (1 MiB objects); its clients' tokens."""
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 2, "clients": ",".join(CLIENTS)},
        content=_model(0),
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def _upload(gw: GatewayThread, token: str, client: str) -> httpx.Response:
    return post_update(gw.url, "j1", 1, token, client, _model(CLIENTS.index(client) + 1), 3)


def _refusals(gw: GatewayThread) -> float:
    sample = gw.gw.metrics.registry.get_sample_value
    return sample("fedfaas_gateway_updates_rejected_total", {"code": "store_full"}) or 0.0


def _ballast(root: Path, nbytes: int) -> Path:
    """Another node's store on the same machine: ``nbytes`` of allocated memory pages."""
    folder = root / "other-node" / "j"
    folder.mkdir(mode=0o700, parents=True)
    path = folder / "ballast"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)
    return path


def test_an_upload_past_the_nodes_budget_waits_503_and_counts_once_there_is_room(
    make_gw,
) -> None:  # type: ignore[no-untyped-def]
    # pool 2: the model takes one pre-faulted buffer, c0's update the other; c1 needs a new one
    gw: GatewayThread = make_gw(pool=2, node_memory_bytes=BUDGET)
    root = gw.settings.shm_root
    tokens = _create(gw)
    job = gw.gw.jobs["j1"]
    obj = job.spec.object_nbytes
    assert obj > MIB and job.ns.stats()["pooled"] == 1
    held = store_bytes(root)
    assert held >= 2 * obj  # the model and the pre-faulted buffer, as the memory file system counts
    ballast = _ballast(root, BUDGET - held - obj // 2)  # room for half an object more
    assert store_bytes(root) + obj > BUDGET

    r = _upload(gw, tokens["c0"], "c0")
    assert r.status_code == 202, r.text  # a buffer kept for reuse: no new memory, not refused

    got: list[UploadReceipt | BaseException] = []

    def upload_c1() -> None:  # the SDK, which waits out 503s and sends again
        try:
            with FLClient(gw.url, "j1", "c1", tokens["c1"]) as fl:
                got.append(fl.upload(1, _model(2), 3, unavailable_wait=120))
        except BaseException as exc:  # reported by the assertion below
            got.append(exc)

    r = _upload(gw, tokens["c1"], "c1")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["error"] == "store_full" and r.headers["retry-after"].isdigit()
    assert f"memory budget ({BUDGET} bytes; node_memory_bytes)" in body["detail"]
    eng = job.engine
    assert eng is not None and eng.accepted == 1  # nothing of c1 kept
    assert job.ns.stats()["objects"] == 2
    t = threading.Thread(target=upload_c1)
    t.start()
    try:
        wait_until(
            lambda: _refusals(gw) >= 2,
            30,
            "the SDK's upload of c1 refused 503 store_full too",
        )
        assert eng.accepted == 1
    finally:
        ballast.unlink()  # the other node's store went: room again
    t.join(150)
    [receipt] = got
    assert isinstance(receipt, UploadReceipt), receipt  # sent again once there was room
    assert store_bytes(root) <= BUDGET


def test_the_root_lends_a_round_to_flstore_only_under_half_the_budget_and_whole(
    make_gw, checkpoints_to, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """With a handoff (an engine and checkpoints), an accepted update is kept in the store for
    the cache functions while the stores hold under half the node's budget. Past it, the round
    is not lent at all: the updates kept so far are let go (they leave once aggregated;
    FLStore reads them from MinIO, where they are checkpointed all the same)."""
    token = tmp_path / "engine-token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    gw: GatewayThread = make_gw(
        pool=2,
        node_memory_bytes=BUDGET,
        engine_url="http://127.0.0.1:9",  # never answers: the notice is retried, nothing more
        engine_token_file=token,
        **checkpoints_to(f"budget-{os.urandom(3).hex()}"),
    )
    assert gw.gw.handoff is not None
    tokens = _create(gw)
    job = gw.gw.jobs["j1"]
    assert _upload(gw, tokens["c0"], "c0").status_code == 202
    kept = job.handoff[1]
    assert kept is not None and list(kept) == ["c0"]
    c0 = kept["c0"]
    # the round's lease and FLStore's (the checkpoint's goes once it is in MinIO)
    wait_until(lambda: job.ns.leases(c0) == 2, 30, "c0's update checkpointed")
    _ballast(gw.settings.shm_root, BUDGET // 2)  # another node's store: past half the budget
    assert _upload(gw, tokens["c1"], "c1").status_code == 202
    assert job.handoff[1] is None  # not lent: c0's update is no longer kept for FLStore
    assert job.ns.leases(c0) == 1  # the round's own: it leaves once aggregated

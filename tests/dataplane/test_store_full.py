"""A node whose object store's memory file system is full (``/dev/shm`` at its size): nothing
acknowledged is lost, no slot is stuck, nothing leaks, and every refusal is visible.

The store lives on a small tmpfs of the test's own, filled to the last page by a ballast file.

- At job creation: no room for the initial model answers 503 ``store_full`` with
  ``Retry-After`` and leaves no store behind; once there is room the job is created.
- Mid round, the exact point of fault (k) of the fault campaign: an upload that lands in a
  pre-faulted buffer is journaled and routed, and the store then refuses its leaf's
  accumulator. Regression: that refusal raised out of the round's pump into the upload, which
  was answered 500 and its object freed while the journal and the round still named it; the
  aggregator could not open it, the slot stayed on its endpoint and was re-run every 10 s with
  a new accumulator each time, and the round never ended. Now the upload is answered 202, the
  slot waits without an endpoint (counted in ``fedfaas_gateway_accumulators_refused``), the
  next upload is refused 503 ``store_full`` and the SDK sends it again, and once the ballast
  goes the round publishes the exact FedAvg with no object left over.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client.sdk import FLClient, UploadReceipt
from core import wire
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, tiny_model
from tests.dataplane.rounds import assert_fedavg, expected, post_update, wait_version
from tests.polling import wait_until

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1", "c2", "c3"]
SEEDS, WEIGHTS = [61, 62, 63, 64], [2, 3, 5, 7]


class Ballast:
    """A file that takes every free page of a tmpfs (:meth:`fill`) until :meth:`empty`."""

    def __init__(self, fs: Path) -> None:
        self.path = fs / "ballast"

    def fill(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            size, step = os.fstat(fd).st_size, 1 << 20
            while step >= 4096:
                try:
                    os.posix_fallocate(fd, size, step)
                    size += step
                except OSError:  # ENOSPC: try a smaller piece, down to one page
                    step //= 2
        finally:
            os.close(fd)
        st = os.statvfs(self.path.parent)
        assert st.f_bavail == 0, "the tmpfs still has free pages"

    def empty(self) -> None:
        self.path.unlink(missing_ok=True)


@pytest.fixture()
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of this test's own (root's ``mount``), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "fs"
    where.mkdir(mode=0o700)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _create(gw: GatewayThread) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=wire.encode_tensors(tiny_model(0)),
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
        timeout=60,
    )


def _post(gw: GatewayThread, tokens: dict[str, str], client: str) -> httpx.Response:
    i = CLIENTS.index(client)
    body = wire.encode_tensors(tiny_model(SEEDS[i], 3.0))
    return post_update(gw.url, "j1", 1, tokens[client], client, body, WEIGHTS[i])


def _sample(gw: GatewayThread, name: str, **labels: str) -> float:
    return gw.gw.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_job_created_on_a_full_store_is_refused_503_and_leaves_nothing(
    make_gw, small_fs: Path
) -> None:  # type: ignore[no-untyped-def]
    gw: GatewayThread = make_gw(shm_root=small_fs / "store", pool=4)
    ballast = Ballast(small_fs)
    ballast.fill()
    try:
        r = _create(gw)
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "store_full" and r.headers["retry-after"].isdigit()
        assert "j1" not in gw.gw.jobs
        assert not (small_fs / "store" / "n1" / "j1").exists()  # no store left behind
    finally:
        ballast.empty()
    r = _create(gw)  # the same request, once there is room
    assert r.status_code == 201, r.text


def test_an_accumulator_the_full_store_refuses_leaves_no_slot_stuck_and_loses_nothing(
    make_gw, small_fs: Path
) -> None:  # type: ignore[no-untyped-def]
    # pool 2: the model takes one pre-faulted buffer, c0's update the other; then nothing
    gw: GatewayThread = make_gw(shm_root=small_fs / "store", pool=2, fanout=2)
    r = _create(gw)
    assert r.status_code == 201, r.text
    tokens = dict(r.json()["tokens"])
    job = gw.gw.jobs["j1"]
    aggs = Aggregators(gw)
    ballast = Ballast(small_fs)
    got: list[UploadReceipt | BaseException] = []

    def upload_c1() -> None:  # the SDK, which waits out 503s and sends again
        try:
            with FLClient(gw.url, "j1", "c1", tokens["c1"]) as fl:
                body = wire.encode_tensors(tiny_model(SEEDS[1], 3.0))
                got.append(fl.upload(1, body, WEIGHTS[1], unavailable_wait=120))
        except BaseException as exc:  # reported by the assertion below
            got.append(exc)

    try:
        aggs.start(2)  # endpoints are free: c0's leaf starts as c0's update lands
        ballast.fill()
        r = _post(gw, tokens, "c0")
        assert r.status_code == 202, r.text  # journaled and in the round: acknowledged
        eng = job.engine
        assert eng is not None and eng.accepted == 1
        assert eng.store_refusals >= 1  # its leaf's accumulator was refused...
        assert _sample(gw, "fedfaas_gateway_accumulators_refused_total") >= 1
        leaf = next(s for s in eng.slots.values() if s.updates)
        assert leaf.endpoint is None and leaf.acc is None  # ...so it waits, on no endpoint
        assert job.ns.stats()["objects"] == 2  # the model and c0's update, no accumulator
        t = threading.Thread(target=upload_c1)
        t.start()
        wait_until(
            lambda: _sample(gw, "fedfaas_gateway_updates_rejected_total", code="store_full") >= 1,
            30,
            "c1's upload refused 503 store_full",
        )
        assert eng.accepted == 1 and leaf.endpoint is None
    finally:
        ballast.empty()
    try:
        t.join(150)
        [receipt] = got
        assert isinstance(receipt, UploadReceipt), receipt  # sent again once there was room
        for c in CLIENTS[2:]:
            assert _post(gw, tokens, c).status_code == 202
        model = wait_version(gw.url, tokens["c0"], 1)
        assert_fedavg(model, expected(SEEDS, WEIGHTS))
        assert job.dropped_updates == 0
        wait_until(lambda: job.ns.stats()["objects"] == 1, 30, "only the new model left")
    finally:
        aggs.stop()

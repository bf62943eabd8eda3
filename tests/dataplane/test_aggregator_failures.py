"""An aggregator endpoint never skips an object it cannot use in silence.

Regression: a frame naming a key that is not in the store (or a truncated object) raised inside
the endpoint, which logged it in its own log and went on; the gateway heard nothing and re-ran
the slot every stall limit with no word of why. Now the endpoint answers a FAILED frame naming
the object and why (``bpf.Failure``) and logs it at ERROR with the key; the endpoint keeps
serving. A real replica of the ``aggregator`` function (its own process, as the runtime starts
it) registers with a real router, and the test plays the gateway on a real store.

With a real gateway: an acknowledged update whose object vanished from the store (freed behind
the gateway's back) fails its slot visibly, in the gateway's log, in the job's status (the
key named) and in ``fedfaas_gateway_aggregator_failures_total``, each time the slot is run
again. Eager or lazy: a lazy round re-runs no slot for silence alone, and once re-ran no slot
after a FAILED frame either, so its round waited for good after the first failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import bpf
from bench.harness.aggregators import NodeAggregators
from bpf import Failure, Frame, Kind, Role
from core import shards, wire
from core.objstore import Namespace
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, tiny_model
from tests.dataplane.rounds import post_update
from tests.polling import wait_until

pytestmark = pytest.mark.integration

JOB = 7
SPEC = wire.ModelSpec.build([("w", "F32", (64,))])
MISSING = bytes.fromhex("00112233445566778899aabbccddeeff")


class Setup:
    """A router, a store, the test's own (gateway) endpoint, and one granted aggregator."""

    def __init__(self, tmp_path: Path) -> None:
        self.router = bpf.RouterServer(str(tmp_path / "router.sock")).start()
        self.ns = Namespace(tmp_path / "shm", "n1", "j1", SPEC.object_nbytes, pool=4)
        self.gw = self.router.local_endpoint(JOB)
        self.log_dir = tmp_path / "aggregators"
        self.aggs = NodeAggregators("n1", Path(self.router.socket_path), self.log_dir)

    def start(self) -> int:
        self.aggs.spawn(1, endpoints=1)

        def registered() -> dict[int, bpf.EndpointInfo]:
            return {e: i for e, i in self.router.endpoints().items() if not i.local}

        wait_until(lambda: bool(registered()), 60, "the replica's endpoint registered")
        [ep] = registered()
        self.router.grant(ep, JOB, str(self.ns.path), role="aggregator")
        return ep

    def send(self, ep: int, kind: Kind, key: bytes, **kw: int | float) -> None:
        self.gw.send(Frame(dst=ep, src=0, kind=kind, job=JOB, key=key, round=1, **kw))

    def task(self, ep: int, goal: int = 2) -> bytes:
        acc = self.ns.allocate()
        acc.close()
        self.send(
            ep, Kind.TASK, acc.key_bytes, flags=Role.LEAF, count=goal, parent=self.gw.id, seq=1
        )
        return acc.key_bytes

    def update(self, seed: int) -> bytes:
        obj = self.ns.allocate()
        wire.decode_into(wire.encode_tensors(_model(seed)), SPEC, obj.buf, 1 << 20)
        wire.write_header(obj.buf, SPEC, kind=wire.KIND_UPDATE, weight=1.0, count=1, round=1)
        obj.close()
        self.ns.seal(obj.key)
        return obj.key_bytes

    def next_frame(self, kind: Kind, timeout: float = 30) -> Frame:
        got: list[Frame] = []

        def arrived() -> bool:
            f = self.gw.recv(timeout=0.2)
            if f is not None and f.kind == kind:
                got.append(f)
            return bool(got)

        wait_until(arrived, timeout, f"a {kind.name} frame from the endpoint")
        return got[0]

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.log_dir.glob("*.log"))

    def close(self) -> None:
        self.aggs.stop()
        self.gw.close()
        self.router.stop()
        self.ns.close()


def _model(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).standard_normal(64).astype(np.float32)}


@pytest.fixture()
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _failed(f: Frame, key: bytes, why: Failure, kind: Kind, seq: int = 1) -> None:
    assert (f.kind, f.key, Failure(f.count), Kind(f.flags)) == (Kind.FAILED, key, why, kind), f
    assert (f.job, f.round, f.seq) == (JOB, 1, seq)


def test_a_key_not_in_the_store_comes_back_failed_with_the_key_and_the_endpoint_goes_on(
    setup: Setup,
) -> None:
    ep = setup.start()
    setup.task(ep)
    setup.send(ep, Kind.UPDATE, MISSING, weight=1.0, count=1, seq=1)
    _failed(setup.next_frame(Kind.FAILED), MISSING, Failure.MISSING, Kind.UPDATE)
    wait_until(
        lambda: f"object {MISSING.hex()} is not in the store" in setup.log_text(),
        30,
        "the endpoint's log line naming the key",
    )
    assert "ERROR" in next(ln for ln in setup.log_text().splitlines() if MISSING.hex() in ln)
    # the endpoint still serves: a fresh task with two real updates is folded and acked
    setup.task(ep)
    for seed in (1, 2):
        setup.send(ep, Kind.UPDATE, setup.update(seed), weight=1.0, count=1, seq=1)
    ack = setup.next_frame(Kind.ACK)
    assert ack.count == 2 and ack.seq == 1


def test_a_truncated_object_and_a_missing_accumulator_or_manifest_each_come_back_failed(
    setup: Setup,
) -> None:
    ep = setup.start()
    # an update cut short: a plain-file object of 100 bytes, sealed (no model in it)
    cut = setup.ns.allocate(100)
    cut.close()
    setup.ns.seal(cut.key)
    setup.task(ep)
    setup.send(ep, Kind.UPDATE, cut.key_bytes, weight=1.0, count=1, seq=1)
    _failed(setup.next_frame(Kind.FAILED), cut.key_bytes, Failure.UNREADABLE, Kind.UPDATE)
    # a task whose accumulator is not in the store
    setup.send(ep, Kind.TASK, MISSING, flags=Role.LEAF, count=2, parent=setup.gw.id, seq=3)
    _failed(setup.next_frame(Kind.FAILED), MISSING, Failure.MISSING, Kind.TASK, seq=3)
    # a shard whose pass manifest is not in the store
    setup.send(ep, Kind.SHARD, MISSING, seq=2)
    _failed(setup.next_frame(Kind.FAILED), MISSING, Failure.MISSING, Kind.SHARD, seq=2)
    # a shard of a real manifest, one of whose inputs is not in the store
    base, there = setup.update(1), setup.update(2)
    out = setup.ns.allocate()
    out.close()
    n_coords = (SPEC.object_nbytes - wire.HEADER_SIZE) // 4
    p = shards.Pass(
        shards.ORDER, {"rule": "median"}, [there, MISSING], base, out.key_bytes, [0, n_coords], []
    )
    man = setup.ns.allocate(p.nbytes())
    p.write(man.buf)
    man.close()
    setup.send(ep, Kind.SHARD, man.key_bytes, flags=shards.ORDER, seq=0)
    _failed(setup.next_frame(Kind.FAILED), MISSING, Failure.MISSING, Kind.SHARD, seq=0)
    log_text = setup.log_text()
    assert f"object {cut.key} cannot be read (truncated or corrupt)" in log_text


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_vanished_update_fails_its_slot_visibly_in_the_gateways_log_and_the_job_status(
    make_gw, caplog: pytest.LogCaptureFixture, lazy: bool
) -> None:  # type: ignore[no-untyped-def]
    gw: GatewayThread = make_gw(stall_s=1.0, lazy=lazy)
    clients = ["c0"]
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 1, "goal": 1, "clients": ",".join(clients)},
        content=wire.encode_tensors(tiny_model(0)),
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    token = r.json()["tokens"]["c0"]
    r = post_update(gw.url, "j1", 1, token, "c0", wire.encode_tensors(tiny_model(1)), 3)
    assert r.status_code == 202, r.text  # no endpoint yet: the update waits in its slot
    job = gw.gw.jobs["j1"]
    eng = job.engine
    assert eng is not None
    [key] = [i.key for st in eng.slots.values() for i in st.updates]
    job.ns.free(key)  # gone behind the gateway's back
    aggs = Aggregators(gw)
    try:
        aggs.start(1)
        # failed, then run again after the 1 s stall limit, and failed again: visibly each time
        wait_until(lambda: eng.endpoint_failures >= 2, 60, "the slot failed twice")
        status = httpx.get(
            f"{gw.url}/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"}
        ).json()
        failure = status["progress"]["last_failure"]
        assert f"object {key.hex()} is not in the store" in failure and "UPDATE frame" in failure
        assert status["progress"]["endpoint_failures"] >= 2
        metrics = httpx.get(
            gw.url + "/metrics", headers={"Authorization": f"Bearer {gw.gw.secret}"}
        ).text
        [line] = [
            ln
            for ln in metrics.splitlines()
            if ln.startswith("fedfaas_gateway_aggregator_failures_total ")
        ]
        assert float(line.split()[1]) >= 2, line
        said = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
        assert any(key.hex() in m and "not done" in m for m in said), said
        assert eng.result is None  # nothing published without the update
    finally:
        aggs.stop()

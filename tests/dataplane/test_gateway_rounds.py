"""Whole rounds through a real gateway, router, Redis and aggregator processes.

The global model equals flat FedAvg over the accepted updates, whatever the hierarchy, also
when an aggregator process is killed mid-round (its slot is re-run on another endpoint and
every input re-delivered: each update still counts exactly once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from core import wire
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, tiny_model
from tests.dataplane.rounds import (
    assert_fedavg,
    create,
    expected,
    post_update,
    upload,
    upload_to,
    wait_version,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("goal", "fanout", "lazy"), [(5, 2, False), (4, 4, False), (6, 2, True)])
def test_rounds_produce_flat_fedavg_for_any_plan(
    make_gw, goal: int, fanout: int, lazy: bool
) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=fanout, lazy=lazy, pool=3)
    clients = [f"c{i}" for i in range(goal)]
    info = create(gw, clients, goal, rounds=2)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for rnd in (1, 2):
            seeds = [rnd * 100 + i for i in range(goal)]
            weights = [7 * (i + 1) for i in range(goal)]
            for c, s, w in zip(clients, seeds, weights, strict=True):
                upload(gw.url, info["tokens"], c, rnd, s, w)
            got = wait_version(gw.url, info["tokens"]["c0"], rnd)
            assert_fedavg(got, expected(seeds, weights))
        job = gw.gw.jobs["j1"]
        assert job.version == 2 and job.engine is None  # all rounds done
        st = httpx.get(
            gw.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"}
        ).json()
        assert st["status"] == "done" and st["last_round"]["first_byte_to_result_s"] > 0
        assert job.ns.keys() == [job.global_key.hex()]  # only the global model is left
    finally:
        aggs.stop()


def _endpoint_pid(gw: GatewayThread, slot: int) -> int:
    eng = gw.gw.jobs["j1"].engine
    ep = eng.slots[slot].endpoint
    assert ep is not None
    return gw.gw.router.endpoints()[ep].pid


@pytest.mark.parametrize("victim", ["leaf", "top"])
def test_killed_aggregator_mid_round_still_gives_the_exact_result(make_gw, victim: str) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3)
    clients = [f"c{i}" for i in range(6)]
    info = create(gw, clients, 6)
    aggs = Aggregators(gw)
    seeds, weights = [11, 12, 13, 14, 15, 16], [5, 10, 20, 40, 80, 160]
    try:
        aggs.start(3)
        eng = gw.gw.jobs["j1"].engine
        # top = slot 1, leaves 2..4 with 2 updates each
        upload(gw.url, info["tokens"], "c0", 1, seeds[0], weights[0])
        if victim == "leaf":
            wait_until(
                lambda: eng.slots[2].endpoint is not None and gw.gw.router.metrics() is not None
            )
            time.sleep(0.3)  # let the leaf fold the first update
            pid = _endpoint_pid(gw, 2)
        else:
            # the top folds the first leaf's partial, checkpoints (the partial is freed) and
            # parks; then every replica dies, so the top re-runs elsewhere from its checkpoint
            upload(gw.url, info["tokens"], "c1", 1, seeds[1], weights[1])
            wait_until(lambda: eng.slots[1].ckpt is not None and eng.slots[1].endpoint is None)
            pid = 0
        if pid:
            aggs.kill_pid(pid)
        else:
            for p in set(aggs.endpoints().values()):
                aggs.kill_pid(p)
        aggs.spawn(1)  # the control plane would scale up; the re-run may also reuse a survivor
        start = 1 if victim == "leaf" else 2
        for i in range(start, 6):
            upload(gw.url, info["tokens"], clients[i], 1, seeds[i], weights[i])
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(seeds, weights))
        slot = 2 if victim == "leaf" else 1
        assert gw.gw.jobs["j1"].times[-1].result_ns > 0
        with gw.gw.jobs["j1"].ns.open(gw.gw.jobs["j1"].global_key) as obj:
            h = wire.read_header(obj.buf)
            assert h.count == 6 and h.weight == sum(weights)  # each update exactly once
        assert slot in eng.slots and eng.slots[slot].attempts >= 2
    finally:
        aggs.stop()


@contextmanager
def _two_nodes(
    make_gw, tmp_path: Path, clients: list[str], goal: int, *, rounds: int, replicas: int
) -> Iterator[tuple[GatewayThread, GatewayThread, dict]]:  # type: ignore[no-untyped-def]
    """Node gateways ``a`` (the root) and ``b`` (sharing the admin secret), job ``j1`` over
    both, ``replicas`` aggregator replicas on each: ``(a, b, a's answer to the creation)``."""
    shared = tmp_path / "admin-secret"
    a = make_gw(node="a", fanout=2, pool=3, admin_secret_file=shared)
    b = make_gw(node="b", fanout=2, pool=3, peers={"a": a.url}, admin_secret_file=shared)
    info = create(a, clients, goal, rounds=rounds, nodes="a,b")
    wait_until(lambda: "j1" in b.gw.jobs, 30)
    aggs_a, aggs_b = Aggregators(a), Aggregators(b)
    try:
        aggs_a.start(replicas)
        aggs_b.start(replicas)
        yield a, b, info
    finally:
        aggs_a.stop()
        aggs_b.stop()


def test_two_nodes_send_one_partial_across_and_agree_with_flat_fedavg(
    make_gw, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    clients = [f"c{i}" for i in range(6)]
    with _two_nodes(make_gw, tmp_path, clients, 6, rounds=1, replicas=2) as (a, b, info):
        node_of = info["plan"]["client_nodes"]
        seeds, weights = [21, 22, 23, 24, 25, 26], [3, 1, 4, 1, 5, 9]
        for c, s, w in zip(clients, seeds, weights, strict=True):
            upload(a.url if node_of[c] == "a" else b.url, info["tokens"], c, 1, s, w)
        got = wait_version(a.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(seeds, weights))
        got_b = wait_version(b.url, info["tokens"]["c5"], 1)  # node b serves the same model
        assert_fedavg(got_b, expected(seeds, weights))
        wrong = next(c for c in clients if node_of[c] == "a")
        r = post_update(b.url, "j1", 2, info["tokens"][wrong], wrong, b"x")
        assert r.status_code == 409 and r.json()["error"] in ("wrong_node", "job_finished")


def test_non_root_node_that_serves_a_new_model_first_opens_the_next_round(
    make_gw, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A model GET on node b right after the root publishes must also open round 2 on b."""
    with _two_nodes(make_gw, tmp_path, ["c0", "c1"], 2, rounds=3, replicas=1) as (a, b, info):
        node_of = info["plan"]["client_nodes"]
        on_b = next(c for c in ("c0", "c1") if node_of[c] == "b")
        for c in ("c0", "c1"):
            upload(a.url if node_of[c] == "a" else b.url, info["tokens"], c, 1, 1, 1)
        wait_version(a.url, info["tokens"]["c0"], 1)
        wait_version(b.url, info["tokens"][on_b], 1)  # b fetches v1 from the root
        status = httpx.get(
            f"{b.url}/v1/jobs/j1", headers={"Authorization": f"Bearer {info['tokens'][on_b]}"}
        ).json()
        assert status["version"] == 1 and status["round"] == 2, status
        upload(b.url, info["tokens"], on_b, 2, 2, 1)


def test_round_checkpoints_global_clients_and_meta_to_minio(
    make_gw, minio_server, checkpoints_to
) -> None:  # type: ignore[no-untyped-def]
    from core.checkpoints import make_minio

    gw = make_gw(fanout=2, pool=3, **checkpoints_to("dp-test"))
    clients = ["c0", "c1", "c2"]
    info = create(gw, clients, 3)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for i, c in enumerate(clients):
            upload(gw.url, info["tokens"], c, 1, 40 + i, 2 + i)
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert gw.gw.checkpoints.flush(60)
        mc = make_minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
        names = {o.object_name for o in mc.list_objects("dp-test", prefix="j1/", recursive=True)}
        base = "j1/rounds/000001/"
        assert {base + "global.safetensors", base + "meta.json"} | {
            f"{base}clients/{c}.safetensors" for c in clients
        } <= names
        glob = wire.decode_tensors(mc.get_object("dp-test", base + "global.safetensors").read())
        np.testing.assert_array_equal(glob["layer.weight"], got["layer.weight"])
        c1 = wire.decode_tensors(mc.get_object("dp-test", base + "clients/c1.safetensors").read())
        np.testing.assert_array_equal(c1["layer.weight"], tiny_model(41, 3.0)["layer.weight"])
        meta = json.loads(mc.get_object("dp-test", base + "meta.json").read())
        assert meta["count"] == 3 and meta["clients"] == {"c0": 2, "c1": 3, "c2": 4}
    finally:
        aggs.stop()


def test_a_single_endpoint_runs_the_whole_tree(make_gw) -> None:  # type: ignore[no-untyped-def]
    """The top never waits on the node's last endpoint while a leaf needs it: with one endpoint
    the leaves run one after another and the top last, and the result is exact."""
    gw = make_gw(fanout=2, pool=3)
    clients = [f"c{i}" for i in range(6)]
    info = create(gw, clients, 6, rounds=2)
    aggs = Aggregators(gw)
    try:
        aggs.start(1)
        for rnd, seed0 in ((1, 10), (2, 20)):
            seeds, weights = [seed0 + i for i in range(6)], [1, 2, 3, 1, 2, 3]
            for c, sd, w in zip(clients, seeds, weights, strict=True):
                upload(gw.url, info["tokens"], c, rnd, sd, w)
            assert_fedavg(wait_version(gw.url, info["tokens"]["c0"], rnd), expected(seeds, weights))
    finally:
        aggs.stop()


def test_a_round_holds_a_bounded_number_of_objects_however_many_leaves_it_has(make_gw) -> None:  # type: ignore[no-untyped-def]
    """Bounded retention: an update is freed once its leaf's partial is journaled, a leaf's
    partial once the top's journaled checkpoint covers it. 36 updates, one at a time, go
    through 18 leaves; the store holds the global model, a leaf's inputs and accumulator, the
    top's checkpoints and accumulator and a partial or two in flight: a bound that does not
    depend on the leaves (keeping every partial to the end would hold 18 of them)."""
    gw = make_gw(fanout=2, pool=3)
    clients = [f"c{i}" for i in range(36)]
    info = create(gw, clients, 36)
    aggs = Aggregators(gw)
    try:
        aggs.start(1, endpoints=2)
        seeds, weights = [40 + i for i in range(36)], [1 + i % 5 for i in range(36)]
        for c, sd, w in zip(clients, seeds, weights, strict=True):
            upload(gw.url, info["tokens"], c, 1, sd, w)
        assert_fedavg(wait_version(gw.url, info["tokens"]["c0"], 1), expected(seeds, weights))
        st = httpx.get(
            gw.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"}
        ).json()
        leaves = 18
        assert st["store_stats"]["peak_objects"] <= 10 < leaves
    finally:
        aggs.stop()


def test_the_endpoints_of_a_replica_map_the_arena_once_and_each_slot_written_once(make_gw) -> None:  # type: ignore[no-untyped-def]
    """Three rounds on one replica of two endpoints: the replica maps the job's arena read-only
    once for both endpoints (once more each time the arena grew), and each slot its endpoints
    wrote accumulators into read-write once, kept for the next object the pool puts there: a
    dozen accumulators and more (each round's 3 leaves and the top's) in fewer slots, no slot
    mapped again per object or per endpoint. The replica's status says what it mapped."""
    gw = make_gw(fanout=2, pool=3)
    clients = [f"c{i}" for i in range(6)]
    info = create(gw, clients, 6, rounds=3)
    aggs = Aggregators(gw)
    try:
        [replica] = aggs.spawn(1, endpoints=2)
        aggs.wait_registered(2)
        for rnd in (1, 2, 3):
            seeds, weights = [rnd * 50 + i for i in range(6)], [1, 2, 3, 4, 5, 6]
            for c, sd, w in zip(clients, seeds, weights, strict=True):
                upload(gw.url, info["tokens"], c, rnd, sd, w)
            assert_fedavg(wait_version(gw.url, info["tokens"]["c0"], rnd), expected(seeds, weights))
        status = httpx.get(
            f"{replica.url}/", headers={"Authorization": f"Bearer {aggs.token}"}
        ).json()
        job = gw.gw.jobs["j1"]
        granted = [e for e in status["endpoints"] if e["job"] == job.id]
        maps = [e["arena_maps"] for e in granted]
        assert granted and all(m == maps[0] for m in maps), status  # one reader between them
        slots = job.ns.stats()["arena_slots"]
        tasks = sum(e["tasks_done"] for e in granted)
        assert 1 <= maps[0]["slots"] <= slots < tasks, (maps, slots, tasks)
        assert 1 <= maps[0]["whole"] <= slots, maps  # mapped again only as the arena grew
    finally:
        aggs.stop()


def test_one_warm_replica_serves_two_jobs_back_to_back_without_a_restart(make_gw) -> None:  # type: ignore[no-untyped-def]
    """LIFL's reuse: the endpoint that aggregated job A is granted job B; no new replica."""
    gw = make_gw(fanout=2, pool=3)
    aggs = Aggregators(gw)
    try:
        [replica] = aggs.spawn(1, endpoints=1)
        aggs.wait_registered(1)
        pids = set(aggs.endpoints().values())
        for name, seed0 in (("ja", 70), ("jb", 80)):
            clients = ["c0", "c1", "c2", "c3"]
            info = create(gw, clients, 4, name=name)
            seeds, weights = [seed0 + i for i in range(4)], [1, 2, 3, 4]
            for c, s, w in zip(clients, seeds, weights, strict=True):
                upload_to(gw.url, name, info["tokens"], c, 1, s, w)
            got = wait_version(gw.url, info["tokens"]["c0"], 1, job=name)
            assert_fedavg(got, expected(seeds, weights))
        assert set(aggs.endpoints().values()) == pids == {replica.pid}  # no replica started
        assert gw.gw.metrics.reuses._value.get() >= 1  # an endpoint moved from ja to jb
        status = httpx.get(
            f"{replica.url}/", headers={"Authorization": f"Bearer {aggs.token}"}
        ).json()
        served = {j for e in status["endpoints"] for j in e["jobs_served"]}
        ids = {gw.gw.jobs["ja"].id, gw.gw.jobs["jb"].id}
        assert served == ids
    finally:
        aggs.stop()


@pytest.mark.bpf
def test_rounds_and_failover_over_the_ebpf_sidecar(make_gw) -> None:  # type: ignore[no-untyped-def]
    import bpf

    mode, reason = bpf.probe()
    if mode != "ebpf":
        pytest.skip(f"eBPF sidecar unavailable here: {reason}")
    gw = make_gw(fanout=2, pool=3, prefer_ebpf=True)
    assert gw.gw.router.mode == "ebpf"
    clients = [f"c{i}" for i in range(4)]
    info = create(gw, clients, 4)
    aggs = Aggregators(gw)
    seeds, weights = [61, 62, 63, 64], [4, 3, 2, 1]
    try:
        aggs.start(3)
        eng = gw.gw.jobs["j1"].engine
        upload(gw.url, info["tokens"], "c0", 1, seeds[0], weights[0])
        wait_until(lambda: eng.slots[2].endpoint is not None)
        time.sleep(0.3)
        aggs.kill_pid(_endpoint_pid(gw, 2))
        for i in range(1, 4):
            upload(gw.url, info["tokens"], clients[i], 1, seeds[i], weights[i])
        assert_fedavg(wait_version(gw.url, info["tokens"]["c0"], 1), expected(seeds, weights))
        assert eng.slots[2].attempts == 2
    finally:
        aggs.stop()

"""Journal before free: a round's objects and the previous model are freed only once the
journal names the new version (``gateway.publish``), so a journal that refuses the write, or a
gateway killed while it does, loses nothing. Faults from Redis's own access control (the
gateway's user loses the right to write one key family, ``tests.dataplane.journalfaults``).

- Redis refuses the publication: it is tried again (logged, counted), nothing is freed and the
  old model is served meanwhile; once Redis takes it the round publishes, exact, once.
- The gateway is SIGKILLed while its publication waits for Redis, and started again: the
  round comes back from the journal and publishes the same exact model.
- Redis refuses a round's slot records: they are tried again while the round goes on, the
  inputs they would free stay held, and the round publishes exact with nothing left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from bench.stack import Replicas, start_gateway
from core import wire
from tests.aggregators import Aggregators
from tests.dataplane.gwproc import admin_settings, journal_retries, post_job
from tests.dataplane.gwutil import tiny_model
from tests.dataplane.journalfaults import publish_refused, slot_records_refused
from tests.dataplane.rounds import (
    assert_fedavg,
    create,
    expected,
    post_update,
    upload,
    wait_version,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

CLIENTS = ["c0", "c1", "c2", "c3"]
SEEDS, WEIGHTS = [51, 52, 53, 54], [2, 3, 5, 7]


@contextmanager
def _one_node(make_gw, rounds: int) -> Iterator[tuple]:  # type: ignore[no-untyped-def,type-arg]
    """A gateway (publication retried every 0.1 s at most), job ``j1`` of :data:`CLIENTS`
    (goal 4, ``rounds``), two aggregator replicas: ``(gateway, creation answer, job)``."""
    gw = make_gw(fanout=2, pool=3, retry_max_s=0.1)
    info = create(gw, CLIENTS, 4, rounds=rounds)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        yield gw, info, gw.gw.jobs["j1"]
    finally:
        aggs.stop()


def _retries(gw, op: str) -> float:  # type: ignore[no-untyped-def]
    v = gw.gw.metrics.registry.get_sample_value("fedfaas_gateway_journal_retries_total", {"op": op})
    return v or 0.0


def _task_failures(gw) -> float:  # type: ignore[no-untyped-def]
    reg = gw.gw.metrics.registry
    return sum(
        s.value
        for m in reg.collect()
        if m.name == "fedfaas_gateway_task_failures"
        for s in m.samples
        if s.name.endswith("_total")
    )


def _published(redis_url: str, job: str = "j1") -> dict:  # type: ignore[type-arg]
    r = redis_url.client()  # type: ignore[attr-defined]
    try:
        return dict(json.loads(r.hget(f"fedfaas:job:{job}:state", "global")))
    finally:
        r.close()


def test_a_publication_redis_refuses_is_tried_again_and_frees_nothing_until_it_lands(
    make_gw, redis_url
) -> None:  # type: ignore[no-untyped-def]
    with _one_node(make_gw, rounds=2) as (gw, info, job):
        g0 = job.global_key
        with publish_refused(redis_url, "j1"):
            for c, s, w in zip(CLIENTS, SEEDS, WEIGHTS, strict=True):
                upload(gw.url, info["tokens"], c, 1, s, w)
            wait_until(lambda: _retries(gw, "publish") >= 3, 60, "the publication refused")
            eng = job.engine
            assert eng is not None and eng.result is not None and not eng.closed
            assert job.version == 0 and job.ns.leases(g0)  # the old model, still served
            assert job.ns.leases(eng.result.key)
            # what a restart would run the round again from: the top's journaled checkpoint
            top = next(st for st in eng.slots.values() if st.slot.parent is None)
            held = list(top.pinned)
            assert held and all(job.ns.leases(k) for k in held)
            r = httpx.get(
                gw.url + "/v1/jobs/j1/model",
                headers={"Authorization": f"Bearer {info['tokens']['c0']}"},
            )
            assert r.headers["x-model-version"] == "0"
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert _published(redis_url)["count"] == 4  # once each
        assert not job.ns.leases(g0) and not any(job.ns.leases(k) for k in held)
        for c, s, w in zip(CLIENTS, SEEDS, WEIGHTS, strict=True):
            upload(gw.url, info["tokens"], c, 2, s + 1, w)
        got = wait_version(gw.url, info["tokens"]["c0"], 2)
        assert_fedavg(got, expected([s + 1 for s in SEEDS], WEIGHTS))
        assert job.ns.keys() == [job.global_key.hex()]  # nothing left behind
        assert _task_failures(gw) == 0


def test_slot_records_redis_refuses_are_tried_again_and_the_round_publishes_exact(
    make_gw, redis_url
) -> None:  # type: ignore[no-untyped-def]
    with _one_node(make_gw, rounds=1) as (gw, info, job):
        with slot_records_refused(redis_url, "j1"):
            for c, s, w in zip(CLIENTS[:2], SEEDS[:2], WEIGHTS[:2], strict=True):
                upload(gw.url, info["tokens"], c, 1, s, w)
            wait_until(lambda: _retries(gw, "slot_done") >= 2, 60, "a slot record refused")
            eng = job.engine
            assert eng is not None
            leaf = next(st for st in eng.slots.values() if st.done is not None)
            assert leaf.updates and all(job.ns.leases(i.key) for i in leaf.updates)  # held
        for c, s, w in zip(CLIENTS[2:], SEEDS[2:], WEIGHTS[2:], strict=True):
            upload(gw.url, info["tokens"], c, 1, s, w)
        got = wait_version(gw.url, info["tokens"]["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert job.ns.keys() == [job.global_key.hex()]
        assert _task_failures(gw) == 0


def test_a_gateway_killed_while_its_publication_waits_for_redis_recovers_the_round(
    tmp_path: Path, redis_url: str
) -> None:
    s, admin = admin_settings(tmp_path, redis_url, fanout=2, pool=3, retry_max_s=0.1)
    gw = start_gateway(s, tmp_path / "gateway.log")
    aggs = Replicas(gw, tmp_path / "aggregators")  # they register again after the restart
    try:
        aggs.spawn(1, endpoints=2)
        aggs.wait_registered(2)
        tokens = post_job(gw.url, admin, CLIENTS, goal=4, rounds=2)

        with publish_refused(redis_url, "j1"):
            for c, seed, w in zip(CLIENTS, SEEDS, WEIGHTS, strict=True):
                upload(gw.url, tokens, c, 1, seed, w)
            wait_until(
                lambda: journal_retries(gw.url, admin, "publish") >= 2,
                60,
                "the publication refused",
            )
            os.killpg(gw.pid, signal.SIGKILL)  # between the round's result and its journal
            gw.proc.wait(15)
        gw = start_gateway(s, tmp_path / "gateway.log")  # the same state, store and Redis
        got = wait_version(gw.url, tokens["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert _published(redis_url)["count"] == 4  # every acknowledged update, once
        again = post_update(
            gw.url, "j1", 1, tokens["c1"], "c1", wire.encode_tensors(tiny_model(99))
        )
        assert again.status_code == 409 and again.json()["error"] == "stale_round"
    finally:
        gw.stop()
        aggs.stop()
        shutil.rmtree(s.shm_root, ignore_errors=True)

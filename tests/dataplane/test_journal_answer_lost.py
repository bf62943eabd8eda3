"""An upload whose journal write landed but whose answer was lost counts exactly once (issue 35).

The gateway reaches Redis through a relay (:mod:`tests.dataplane.redisrelay`) that relays one
client's record to Redis, waits until Redis has written it and answered, and then closes the
gateway's connection instead of passing the answer on. Before the fix the upload was answered
409 ``duplicate_client`` (Redis's client library wrote it again by itself, and the second
write found the first) or 500 (the library gave up), its object was freed, and the journal
kept a record of an update no model would hold; the SDK's retry then heard 409
``duplicate_client`` and took it for "it landed". Now the gateway writes the same record again
until Redis answers (the record names the object, so the write is idempotent): the upload is
answered 202 and the update is in the published model, once.

- answer lost once: Redis's client library tries again by itself;
- answers lost until the gateway's own retry takes over: meanwhile the same client's second
  upload is answered 503 ``upload_in_flight`` with ``Retry-After`` (409 would tell the SDK it
  counts), and nothing of it is kept;
- the gateway stopped (SIGTERM) while the answer is still lost: the upload is not answered
  202, its object stays in the store, and the restarted gateway counts it from its journal
  record; the client's second send hears 409 ``duplicate_client``, and it is in the model once;
- Redis refuses the record (an ACL, ``NOPERM``; it answered, and wrote nothing): 503
  ``journal_unavailable`` with ``Retry-After``, nothing kept, and the upload goes through once
  Redis takes records again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from bench.stack import Replicas, start_gateway
from client.sdk import FLClient
from core import wire
from gateway.jobs import Job
from tests.aggregators import Aggregators
from tests.dataplane.gwproc import admin_settings, journal_retries, post_job
from tests.dataplane.gwutil import GatewayThread, settings, tiny_model
from tests.dataplane.journalfaults import writes_refused
from tests.dataplane.redisrelay import ALL, RedisRelay
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
SEEDS, WEIGHTS = [61, 62, 63, 64], [2, 3, 5, 7]
ROUND_KEY = b"fedfaas:job:j1:round:1\r\n"


def _body(i: int) -> bytes:
    return wire.encode_tensors(tiny_model(SEEDS[i], 3.0))


def _c2_record(data: bytes) -> bool:
    """A write of client c2's record of round 1 (its JSON names the update's object)."""
    return ROUND_KEY in data and b"\r\nc2\r\n" in data and b'{"key": "' in data


@pytest.fixture()
def relay(redis_url) -> Iterator[RedisRelay]:  # type: ignore[no-untyped-def]
    port = urlparse(str(redis_url)).port
    assert port is not None
    with RedisRelay(port, _c2_record) as r:
        yield r


def _records(redis_url) -> dict[str, dict]:  # type: ignore[no-untyped-def,type-arg]
    r = redis_url.client()
    try:
        raw = r.hgetall("fedfaas:job:j1:round:1")
    finally:
        r.close()
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def _published_count(redis_url) -> int:  # type: ignore[no-untyped-def]
    r = redis_url.client()
    try:
        return int(json.loads(r.hget("fedfaas:job:j1:state", "global"))["count"])
    finally:
        r.close()


def _send(url: str, token: str, client: str, body: bytes, weight: int) -> httpx.Response:
    return post_update(url, "j1", 1, token, client, body, weight, timeout=60)


@pytest.fixture()
def relayed_gw(tmp_path: Path, redis_url, relay: RedisRelay) -> Iterator[GatewayThread]:  # type: ignore[no-untyped-def]
    """A gateway whose Redis is behind :func:`relay` (its journal retries every 0.1 s at most)."""
    s = settings(tmp_path, redis_url, fanout=2, pool=3, retry_max_s=0.1)
    g = GatewayThread(s.model_copy(update={"redis_url": relay.url})).start()
    try:
        yield g
    finally:
        g.stop()
        shutil.rmtree(s.shm_root, ignore_errors=True)


@contextmanager
def _job(gw: GatewayThread) -> Iterator[tuple[dict[str, str], Job]]:
    """Job ``j1`` of :data:`CLIENTS` (goal 4, one round) on ``gw``, with two aggregator
    replicas: ``(tokens, the gateway's job)``."""
    info = create(gw, CLIENTS, 4, rounds=1)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        yield info["tokens"], gw.gw.jobs["j1"]
    finally:
        aggs.stop()


@pytest.mark.parametrize("lost", [1, ALL], ids=["lost-once", "lost-until-the-gateway-retries"])
def test_an_update_whose_journal_answer_is_lost_is_acknowledged_and_counted_once(
    relayed_gw: GatewayThread, redis_url, relay: RedisRelay, lost: int
) -> None:  # type: ignore[no-untyped-def]
    gw = relayed_gw
    with _job(gw) as (tokens, job):
        for i in (0, 1):
            upload(gw.url, tokens, CLIENTS[i], 1, SEEDS[i], WEIGHTS[i])
        relay.lose(lost)
        with (
            FLClient(gw.url, "j1", "c2", tokens["c2"], timeout=120) as fl,
            ThreadPoolExecutor(1) as pool,
        ):
            sent: Future = pool.submit(fl.upload, 1, _body(2), WEIGHTS[2])
            if lost == ALL:
                admin = {"Authorization": f"Bearer {gw.gw.secret}"}
                wait_until(
                    lambda: journal_retries(gw.url, admin, "accept") >= 1,
                    120,
                    "the gateway's retry",
                )
                again = _send(gw.url, tokens["c2"], "c2", _body(2), WEIGHTS[2])
                assert again.status_code == 503, again.text
                assert again.json()["error"] == "upload_in_flight"
                assert again.headers["retry-after"] == "1"
                relay.passing()
            receipt = sent.result(120)
        assert not receipt.resent and receipt.key  # answered 202, by the upload itself
        assert relay.lost >= (1 if lost == 1 else 2)
        records = _records(redis_url)
        assert sorted(records) == ["c0", "c1", "c2"] and records["c2"]["key"] == receipt.key
        assert job.ns.leases(receipt.key)  # its object is held: its leaf waits for c3
        upload(gw.url, tokens, "c3", 1, SEEDS[3], WEIGHTS[3])
        got = wait_version(gw.url, tokens["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert _published_count(redis_url) == 4  # each update once


def test_a_gateway_stopped_before_the_answer_came_counts_the_update_after_its_restart(
    tmp_path: Path, redis_url, relay: RedisRelay
) -> None:  # type: ignore[no-untyped-def]
    s, admin = admin_settings(tmp_path, redis_url, fanout=2, pool=3, retry_max_s=0.1)
    s = s.model_copy(update={"redis_url": relay.url})
    gw = start_gateway(s, tmp_path / "gateway.log")
    aggs = Replicas(gw, tmp_path / "aggregators")  # they register again after the restart
    try:
        aggs.spawn(1, endpoints=2)
        aggs.wait_registered(2)
        tokens = post_job(gw.url, admin, CLIENTS, goal=4, rounds=1)
        for i in (0, 1):
            upload(gw.url, tokens, CLIENTS[i], 1, SEEDS[i], WEIGHTS[i])

        relay.lose(ALL)
        with ThreadPoolExecutor(1) as pool:
            first: Future = pool.submit(_send, gw.url, tokens["c2"], "c2", _body(2), WEIGHTS[2])
            wait_until(
                lambda: journal_retries(gw.url, admin, "accept") >= 1, 120, "the gateway's retry"
            )
            assert relay.lost >= 1 and "c2" in _records(redis_url)  # it landed, unanswered
            os.kill(gw.pid, signal.SIGTERM)
            assert gw.proc.wait(s.stop_grace + 10) == 0  # a clean stop
            try:
                answer = first.result(60)
            except httpx.TransportError:
                pass  # the connection closed with the gateway: no answer at all
            else:
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"] == "journal_unavailable"
        relay.passing()
        gw = start_gateway(s, tmp_path / "gateway.log")  # the same state, store and journal
        again = _send(gw.url, tokens["c2"], "c2", _body(2), WEIGHTS[2])
        assert again.status_code == 409 and again.json()["error"] == "duplicate_client"
        upload(gw.url, tokens, "c3", 1, SEEDS[3], WEIGHTS[3])
        got = wait_version(gw.url, tokens["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert _published_count(redis_url) == 4
    finally:
        gw.stop()
        aggs.stop()
        shutil.rmtree(s.shm_root, ignore_errors=True)


def test_a_record_redis_refuses_is_answered_503_and_keeps_nothing(make_gw, redis_url) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3, retry_max_s=0.1)
    with _job(gw) as (tokens, job):
        upload(gw.url, tokens, "c0", 1, SEEDS[0], WEIGHTS[0])
        before = sorted(job.ns.keys())
        with writes_refused(redis_url, ["fedfaas:jobs", "fedfaas:job:j1:state"]):
            r = _send(gw.url, tokens["c1"], "c1", _body(1), WEIGHTS[1])
            assert r.status_code == 503, r.text
            assert (
                r.json()["error"] == "journal_unavailable" and "permissions" in r.json()["detail"]
            )
            assert r.headers["retry-after"] == "1"
            assert sorted(job.ns.keys()) == before and sorted(_records(redis_url)) == ["c0"]
            assert job.engine is not None and job.engine.accepted == 1 and not job.inflight
        for i in (1, 2, 3):
            upload(gw.url, tokens, CLIENTS[i], 1, SEEDS[i], WEIGHTS[i])
        got = wait_version(gw.url, tokens["c0"], 1)
        assert_fedavg(got, expected(SEEDS, WEIGHTS))
        assert _published_count(redis_url) == 4

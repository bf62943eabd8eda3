"""Async mode (FedBuff, issue 14 item 4) on real gateways with real aggregator replicas:
updates trained on any of the last ``max_staleness + 1`` versions fold into the open buffer
with their staleness weight, a full buffer is applied and the version advances, and every
published model equals a plain FedBuff written from the paper on the same sequence of
uploads. The root's older models are journaled (a SIGKILLed root applies the next buffer to
the same bases), the mode is in every published model (a job resumed from MinIO stays
async), and bad specs and bad uploads are refused with what is wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from client.sdk import ASYNC_KEY
from core import fedavg, wire
from core.fedbuff import METADATA_KEY, AsyncSpec
from core.services import free_port
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import delete_and_resume, tiny_model
from tests.dataplane.rounds import assert_job_refused, job_request, post_update, wait_version
from tests.dataplane.test_gateway_recovery import _aggregators, _gateway, _kill

pytestmark = pytest.mark.integration

FLOAT = ("layer.bias", "layer.weight")  # "steps" is int64 on the wire: rounded when published
CLIENTS = [f"c{i}" for i in range(6)]
SPEC = {"max_staleness": 2, "eta": 0.8}


class FedBuffReference:
    """FedBuff as the paper writes it (Nguyen et al. 2022, Algorithm 1), one update at a
    time: ``delta += w(s) * (w_i - x_base)``; after ``K`` updates ``x += eta * delta / K``."""

    def __init__(self, spec: dict[str, object], k: int) -> None:
        init = {n: tiny_model(0)[n].astype(np.float64) for n in FLOAT}
        self.versions = [init]
        self.spec, self.k = AsyncSpec.from_json(spec), k
        self.delta = {n: np.zeros_like(v) for n, v in init.items()}
        self.n = 0

    def update(self, rnd: int, seed: int) -> None:
        base = rnd - 1
        s = len(self.versions) - 1 - base  # versions published since the client's base
        w = tiny_model(seed, 3.0)
        for n in FLOAT:
            self.delta[n] += self.spec.weight(s) * (w[n] - self.versions[base][n])
        self.n += 1
        if self.n == self.k:
            x = self.versions[-1]
            self.versions.append({n: x[n] + self.spec.eta * self.delta[n] / self.k for n in FLOAT})
            self.delta = {n: np.zeros_like(v) for n, v in x.items()}
            self.n = 0


def _create(url: str, secret: str, spec: object, rounds: int = 4, **params: str) -> httpx.Response:
    return job_request(
        url, secret, CLIENTS, 3, rounds, metadata={ASYNC_KEY: json.dumps(spec)}, **params
    )


def _send(url: str, tokens: dict[str, str], client: str, rnd: int, seed: int) -> httpx.Response:
    return post_update(
        url, "j1", rnd, tokens[client], client, wire.encode_tensors(tiny_model(seed, 3.0)), 7
    )


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], v: int) -> None:
    for n in FLOAT:
        assert fedavg.rel_error(got[n], want[n]) <= 1e-5, (n, v)


#: (client, round it uploads to = its base version + 1, seed), buffer by buffer (K = 3)
BUFFERS = [
    [("c0", 1, 1), ("c1", 1, 2), ("c2", 1, 3)],  # all fresh
    [("c3", 1, 4), ("c0", 2, 5), ("c4", 1, 6)],  # two trained on version 0: staleness 1
    [("c5", 1, 7), ("c1", 3, 8), ("c2", 2, 9)],  # staleness 2 (the most), 0 and 1
]


def test_buffers_fold_stale_updates_and_every_version_equals_plain_fedbuff(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3)
    r = _create(gw.url, gw.gw.secret, SPEC)
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    ref = FedBuffReference(SPEC, 3)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for v, buffer in enumerate(BUFFERS, start=1):
            for client, rnd, seed in buffer:
                r = _send(gw.url, tokens, client, rnd, seed)
                assert r.status_code == 202, r.text
                assert r.json()["round"] == v  # taken into the open buffer
                ref.update(rnd, seed)
            _same(wait_version(gw.url, tokens["c0"], v), ref.versions[v], v)
        # buffer 4 (version 3 is current): what it refuses, and why
        for client, rnd, code in [
            ("c3", 1, "too_stale"),  # trained on version 0: 3 versions old, max_staleness 2
            ("c4", 5, "future_round"),
        ]:
            r = _send(gw.url, tokens, client, rnd, 99)
            assert (r.status_code, r.json()["error"]) == (409, code), r.text
            assert code != "too_stale" or "at most 2 versions old" in r.json()["detail"]
        assert _send(gw.url, tokens, "c1", 4, 10).status_code == 202
        ref.update(4, 10)
        r = _send(gw.url, tokens, "c1", 3, 11)  # one update per client per buffer
        assert (r.status_code, r.json()["error"]) == (409, "duplicate_client")
        for client, rnd, seed in [("c0", 3, 12), ("c2", 2, 13)]:
            assert _send(gw.url, tokens, client, rnd, seed).status_code == 202
            ref.update(rnd, seed)
        _same(wait_version(gw.url, tokens["c0"], 4), ref.versions[4], 4)
        # the served model names the mode (a client sees it; a resumed job keeps it)
        model = httpx.get(
            gw.url + "/v1/jobs/j1/model", headers={"Authorization": f"Bearer {tokens['c0']}"}
        )
        meta = json.loads(model.content[8 : 8 + int.from_bytes(model.content[:8], "little")])
        assert json.loads(meta["__metadata__"][METADATA_KEY]) == AsyncSpec(**SPEC).to_json()
        # finished: the job holds its model only (history and buffers freed)
        job = gw.gw.jobs["j1"]
        assert job.version == 4 and len(job.ns.keys()) == 1
    finally:
        aggs.stop()


def test_the_root_keeps_only_the_models_a_next_update_may_have_trained_on(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3)
    tokens = _create(gw.url, gw.gw.secret, SPEC, rounds=6).json()["tokens"]
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        seed = 0
        for v in range(1, 5):
            for client in CLIENTS[:3]:
                seed += 1
                assert _send(gw.url, tokens, client, v, seed).status_code == 202
            wait_version(gw.url, tokens["c0"], v)
            job = gw.gw.jobs["j1"]
            assert sorted(job.history) == list(range(max(0, v - 2), v))
            want = {job.global_key, *job.history.values()}
            assert set(job.ns.keys()) == {k.hex() for k in want if k is not None}
    finally:
        aggs.stop()


def test_a_sigkilled_root_applies_the_next_buffer_to_the_same_bases(
    tmp_path: Path, redis_url: str
) -> None:
    shm = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    port = free_port()
    gw = _gateway(tmp_path, redis_url, port, shm)
    url = f"http://127.0.0.1:{port}"
    secret = (tmp_path / "state" / "admin-secret").read_text().strip()
    r = _create(url, secret, SPEC, rounds=3)
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    ref = FedBuffReference(SPEC, 3)
    aggs = _aggregators(tmp_path, url)
    aggs.spawn(2)
    try:
        aggs.wait_registered(2)
        for v, buffer in enumerate(BUFFERS[:2], start=1):
            for client, rnd, seed in buffer:
                assert _send(url, tokens, client, rnd, seed).status_code == 202
                ref.update(rnd, seed)
            _same(wait_version(url, tokens["c0"], v), ref.versions[v], v)
        # buffer 3: two updates (one on version 0, kept in the root's history) journaled, then
        # the root is killed; the restarted root adopts the history and the buffer
        for client, rnd, seed in BUFFERS[2][:2]:
            assert _send(url, tokens, client, rnd, seed).status_code == 202
            ref.update(rnd, seed)
        _kill(gw, signal.SIGKILL)
        gw = _gateway(tmp_path, redis_url, port, shm)  # same store and journal
        client, rnd, seed = BUFFERS[2][2]
        r = _send(url, tokens, client, rnd, seed)
        assert r.status_code == 202, r.text
        ref.update(rnd, seed)
        _same(wait_version(url, tokens["c0"], 3), ref.versions[3], 3)
    finally:
        _kill(gw, signal.SIGTERM)
        aggs.stop()
        shutil.rmtree(shm, ignore_errors=True)


def test_a_job_resumed_from_its_checkpoint_stays_async(make_gw, checkpoints_to) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3, **checkpoints_to("async-resume"))
    tokens = _create(gw.url, gw.gw.secret, SPEC, rounds=3).json()["tokens"]
    ref = FedBuffReference(SPEC, 3)
    aggs = Aggregators(gw)
    try:
        aggs.start(2)
        for client, rnd, seed in BUFFERS[0]:
            assert _send(gw.url, tokens, client, rnd, seed).status_code == 202
            ref.update(rnd, seed)
        _same(wait_version(gw.url, tokens["c0"], 1), ref.versions[1], 1)
        tokens = delete_and_resume(gw, CLIENTS, 3, goal=3)["tokens"]
        job = gw.gw.jobs["j1"]
        assert job.fedbuff == AsyncSpec(**SPEC) and job.version == 1 and not job.history
        # the models before the checkpoint are not kept: an update trained on one is refused
        r = _send(gw.url, tokens, "c3", 1, 4)
        assert (r.status_code, r.json()["error"]) == (409, "too_stale"), r.text
        for client, rnd, seed in [("c0", 2, 5), ("c4", 2, 6), ("c5", 2, 7)]:
            assert _send(gw.url, tokens, client, rnd, seed).status_code == 202
            ref.update(rnd, seed)
        _same(wait_version(gw.url, tokens["c0"], 2), ref.versions[2], 2)
    finally:
        aggs.stop()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"max_staleness": -1}, "max_staleness"),
        ({"max_staleness": 1000}, "max_staleness"),
        ({"staleness": "exp"}, "staleness must be one of"),
        ({"eta": 0}, "eta"),
        ({"a": -0.5}, "a must be"),
        ({"buffer": 3}, "unknown keys"),
        ("not json", "async"),
    ],
)
def test_a_bad_async_spec_is_refused_with_what_to_change_and_nothing_is_created(
    make_gw, spec: object, says: str
) -> None:  # type: ignore[no-untyped-def]
    raw = spec if isinstance(spec, str) else json.dumps(spec)
    assert_job_refused(make_gw(), CLIENTS, {ASYNC_KEY: raw}, "bad_async", says)


def test_async_with_a_server_optimizer_is_refused(make_gw) -> None:  # type: ignore[no-untyped-def]
    from client.sdk import SERVER_OPT_KEY

    both = {ASYNC_KEY: "{}", SERVER_OPT_KEY: json.dumps({"name": "fedadam"})}
    assert_job_refused(make_gw(), CLIENTS, both, "bad_async", "")


def test_the_sdk_and_the_gateway_name_the_same_metadata_entry() -> None:
    assert ASYNC_KEY == METADATA_KEY

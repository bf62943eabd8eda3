"""A job resumes from its last MinIO checkpoint after its gateway, store and journal are gone."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from core import wire
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import resume_job, tiny_bytes, tiny_model
from tests.dataplane.rounds import create, post_update, upload, wait_version

pytestmark = pytest.mark.integration


def test_job_resumes_from_its_last_checkpoint_after_gateway_store_and_journal_are_lost(
    make_gw, checkpoints_to, redis_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "admin-secret"
    clients = ["c0", "c1"]
    first = make_gw(fanout=2, pool=3, admin_secret_file=secret, **checkpoints_to("resume"))
    info = create(first, clients, 2, rounds=3)
    aggs = Aggregators(first)
    try:
        aggs.start(1)
        upload(first.url, info["tokens"], "c0", 1, 11, 2)
        upload(first.url, info["tokens"], "c1", 1, 12, 3)
        v1 = wait_version(first.url, info["tokens"]["c0"], 1)
        assert first.gw.checkpoints.flush(60)
    finally:
        aggs.stop()
    first.stop()
    redis_url.client().flushall()  # the journal is gone (and the next gateway has a store root of its own)

    second = make_gw(fanout=2, pool=3, admin_secret_file=secret, **checkpoints_to("resume"))
    r = resume_job(second, clients, 3)
    assert r.status_code == 201, r.text
    assert r.json()["version"] == 1 and r.json()["round"] == 2
    tokens = r.json()["tokens"]
    old = httpx.get(
        f"{second.url}/v1/jobs/j1/model",
        headers={"Authorization": f"Bearer {info['tokens']['c0']}"},
    )
    assert old.status_code == 401  # a resumed job is a new incarnation: new salt, new tokens
    resumed = wait_version(second.url, tokens["c0"], 1)
    for k, v in v1.items():
        np.testing.assert_array_equal(resumed[k], v)
    aggs = Aggregators(second)
    try:
        aggs.start(1)
        stale = post_update(second.url, "j1", 1, tokens["c0"], "c0", tiny_bytes(1), 1)
        assert stale.status_code == 409 and stale.json()["error"] == "stale_round"
        upload(second.url, tokens, "c0", 2, 21, 1)
        upload(second.url, tokens, "c1", 2, 22, 1)
        wait_version(second.url, tokens["c0"], 2)
    finally:
        aggs.stop()


def test_initial_model_is_checkpointed_as_round_zero(make_gw, minio_server, checkpoints_to) -> None:  # type: ignore[no-untyped-def]
    from core.checkpoints import make_minio

    gw = make_gw(**checkpoints_to("round0"))
    create(gw, ["c0"], 1)
    assert gw.gw.checkpoints.flush(60)
    mc = make_minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    data = mc.get_object("round0", "j1/rounds/000000/global.safetensors").read()
    got, want = wire.decode_tensors(data), tiny_model(0)
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v.astype(np.float32))


def test_bad_resume_requests_get_clear_errors_and_create_nothing(make_gw, checkpoints_to) -> None:  # type: ignore[no-untyped-def]
    plain = make_gw(node="n1")  # no MinIO
    r = resume_job(plain, ["c0"], 2)
    assert r.status_code == 409 and r.json()["error"] == "no_checkpoints"
    gw = make_gw(node="n2", **checkpoints_to("nothing-here"))
    r = resume_job(gw, ["c0"], 2)
    assert r.status_code == 404 and r.json()["error"] == "no_checkpoint"
    r = resume_job(gw, ["c0"], 2, body=tiny_bytes(0))
    assert r.status_code == 400 and r.json()["error"] == "body_with_resume"
    for g in (plain, gw):
        assert httpx.get(
            g.url + "/v1/jobs", headers={"Authorization": f"Bearer {g.gw.secret}"}
        ).json() in ([], {"jobs": []})

"""Per-client metadata (``X-Client-Meta``) from the SDK through the gateway into the round's
``meta.json`` and FLStore's ``client_meta``; bad metadata is a clear 400 after authentication,
and an unauthenticated upload is refused before its body is read. Also: the evaluator a job
declares in its initial weights reaches the round metadata."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import meta
from cache_engine.queries import workload_data
from client.sdk import FLClient, with_metadata
from core.services import MinioServer
from gateway.meta import parse_client_meta
from tests.aggregators import Aggregators
from tests.dataplane.gwutil import GatewayThread, settings, tiny_bytes

CLIENTS = ["c0", "c1", "c2"]


# ------------------------------------------------------------------------------------ the parser
def test_client_meta_of_finite_numbers_is_parsed() -> None:
    raw = '{"loss": 0.41, "duration_s": 2, "loss_sq_mean": 1e-3, "epochs": 3}'
    assert parse_client_meta(raw) == {
        "loss": 0.41,
        "duration_s": 2,
        "loss_sq_mean": 0.001,
        "epochs": 3,
    }


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{loss: 1}", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"loss": NaN}', "finite"),
        ('{"loss": Infinity}', "finite"),
        ('{"loss": 1e999}', "finite"),
        ('{"loss": "0.4"}', "number"),
        ('{"loss": true}', "number"),
        ('{"loss": [0.4]}', "number"),
        ('{"loss": {"a": 1}}', "number"),
        ('{"Loss": 1}', "must match"),
        ('{"": 1}', "must match"),
        ('{"n_samples": 10}', "X-Sample-Count"),
        (json.dumps({f"k{i}": i for i in range(17)}), "at most 16"),
        (json.dumps({f"k{i}": 1.0 / 3 for i in range(60)}), "at most 1024 bytes"),
    ],
)
def test_bad_client_meta_is_refused_saying_why(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_client_meta(raw)


def test_sdk_sends_meta_as_compact_json_and_refuses_nan_before_sending() -> None:
    seen: dict[str, str] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen.update(req.headers)
        return httpx.Response(202, json={"key": "00", "round": 1, "client": "c0"})

    with FLClient("http://gw", "j", "c0", "t", transport=httpx.MockTransport(handler)) as fl:
        fl.upload(1, b"body", 5, meta={"loss": 0.5, "duration_s": 1.25})
        assert seen["x-client-meta"] == '{"loss":0.5,"duration_s":1.25}'
        seen.clear()
        with pytest.raises(ValueError):
            fl.upload(1, b"body", 5, meta={"loss": float("nan")})
        assert not seen, "nothing was sent"
        fl.upload(1, b"body", 5)
        assert "x-client-meta" not in seen


# ------------------------------------------------------------------------- a real gateway
@pytest.fixture()
def gw(tmp_path: Path, redis_url: str) -> Iterator[GatewayThread]:
    g = GatewayThread(settings(tmp_path, redis_url, max_inflight=0)).start()
    try:
        yield g
    finally:
        g.stop()
        shutil.rmtree(g.settings.shm_root, ignore_errors=True)  # a stop keeps the stores


def _job(gw: GatewayThread, name: str = "meta", body: bytes | None = None) -> dict[str, str]:
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": name, "rounds": 1, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=tiny_bytes(0) if body is None else body,
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
    )
    assert r.status_code == 201, r.text
    return dict(r.json()["tokens"])


def _upload(gw: GatewayThread, token: str, client: str, meta_header: str) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/jobs/meta/rounds/1/updates",
        content=tiny_bytes(1),
        headers={
            "Authorization": f"Bearer {token}",
            "X-Client-Id": client,
            "X-Sample-Count": "10",
            "X-Client-Meta": meta_header,
        },
    )


@pytest.mark.integration
def test_bad_client_meta_is_a_400_with_a_json_error_and_changes_nothing(
    gw: GatewayThread,
) -> None:
    tokens = _job(gw)
    job = gw.gw.jobs["meta"]
    before = job.ns.keys()
    r = _upload(gw, tokens["c0"], "c0", '{"loss": NaN}')
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == "bad_client_meta"
    assert "X-Client-Meta" in body["detail"] and "finite" in body["detail"]
    assert job.ns.keys() == before and job.engine is not None and job.engine.accepted == 0
    assert _upload(gw, tokens["c0"], "c0", '{"loss": 0.5}').status_code == 202


@pytest.mark.integration
def test_bad_meta_with_a_wrong_token_is_a_401_not_a_400(gw: GatewayThread) -> None:
    _job(gw)
    r = _upload(gw, "0" * 64, "c0", "not json")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


@pytest.mark.integration
def test_unauthenticated_upload_is_refused_before_its_body_is_read(gw: GatewayThread) -> None:
    _job(gw)
    # a body larger than anything the gateway would drain, of which not one byte is sent:
    # the 401 can only come from the head
    head = (
        "POST /v1/jobs/meta/rounds/1/updates HTTP/1.1\r\nHost: x\r\n"
        "X-Client-Id: c0\r\nX-Sample-Count: 10\r\nX-Client-Meta: {bad\r\n"
        f"Content-Length: {1 << 30}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gw.gw.port), timeout=10) as s:
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    assert b" 401 " in status_line, data[:200]
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"] == "unauthorized"


@pytest.mark.integration
def test_client_meta_reaches_the_round_meta_in_minio_and_flstores_client_meta(
    make_gw, minio_server: MinioServer
) -> None:  # type: ignore[no-untyped-def]
    g = make_gw(
        fanout=2,
        pool=4,
        minio_endpoint=minio_server.endpoint,
        minio_credentials_file=minio_server.credentials_file("gateway"),
    )
    job = f"meta-{g.settings.shm_root.name[-8:]}"
    evaluator = {"kind": "digits-softmax", "split_seed": 3}
    declared = with_metadata(tiny_bytes(0), {"fedfaas.evaluator": json.dumps(evaluator)})
    r = httpx.post(
        g.url + "/v1/jobs",
        params={"job": job, "rounds": 1, "goal": len(CLIENTS), "clients": ",".join(CLIENTS)},
        content=declared,
        headers={"Authorization": f"Bearer {g.gw.secret}"},
    )
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    aggs = Aggregators(g)
    try:
        aggs.start(1, endpoints=2)
        sent = {
            "c0": {"loss": 0.25, "duration_s": 1.5, "loss_sq_mean": 0.125},
            "c1": {"loss": 2.0, "duration_s": 0.5},
        }
        for i, c in enumerate(CLIENTS):  # c2 sends no metadata
            with FLClient(g.url, job, c, tokens[c]) as fl:
                fl.upload(1, tiny_bytes(i + 1), 10 + i, meta=sent.get(c))
        with FLClient(g.url, job, "c0", tokens["c0"]) as fl:
            fl.wait_for_version(1, timeout=60)
    finally:
        aggs.stop()
    cold = MinioColdStore(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    g.stop()  # the checkpoint writer flushes on stop
    raw = json.loads(cold.get_bytes(meta(job, 1)))
    assert raw["clients"] == {"c0": 10, "c1": 11, "c2": 12}
    assert raw["client_meta"]["c0"] == {**sent["c0"], "n_samples": 10}
    assert raw["client_meta"]["c2"] == {"n_samples": 12}
    assert raw["round_meta"] == {"evaluator": evaluator}
    got = cold.round_meta(job, 1)  # as the cache engine reads it
    assert got["client_meta"]["c1"] == {**sent["c1"], "n_samples": 11}
    assert got["round_meta"]["evaluator"] == evaluator
    assert cold.round_meta(job, 0)["round_meta"]["evaluator"] == evaluator
    data = workload_data({meta(job, 1): got})  # what a workload (e.g. Oort) is given
    assert data.client_meta[1]["c0"]["loss_sq_mean"] == 0.125
    assert data.n_samples(1, "c1") == 11


@pytest.mark.integration
def test_a_bad_evaluator_declaration_is_refused_at_job_creation(gw: GatewayThread) -> None:
    body = with_metadata(tiny_bytes(0), {"fedfaas.evaluator": '"digits-softmax"'})
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "badeval", "rounds": 1, "goal": 1, "clients": "c0"},
        content=body,
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
    )
    assert r.status_code == 400 and r.json()["error"] == "bad_evaluator", r.text
    assert "badeval" not in gw.gw.jobs

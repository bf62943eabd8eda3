"""Gateway upload path against a real gateway, router and Redis: every bad input is a clear 4xx
that leaves no object behind and the round unchanged; good uploads are sealed and journaled."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from core import wire
from tests.dataplane.gwutil import GatewayThread, settings, tiny_bytes, tiny_model

pytestmark = pytest.mark.integration

CLIENTS = [f"c{i}" for i in range(6)]


@pytest.fixture()
def gw(tmp_path: Path, redis_url: str) -> Iterator[GatewayThread]:
    g = GatewayThread(settings(tmp_path, redis_url, max_header=4096, max_inflight=0)).start()
    try:
        yield g
    finally:
        g.stop()  # the store stays for a next start: what each test leaves is checked in it
        shutil.rmtree(g.settings.shm_root, ignore_errors=True)


@pytest.fixture()
def job(gw: GatewayThread) -> dict[str, str]:
    r = httpx.post(
        gw.url + "/v1/jobs",
        params={"job": "j1", "rounds": 2, "goal": 6, "clients": ",".join(CLIENTS)},
        content=tiny_bytes(0),
        headers={"Authorization": f"Bearer {gw.gw.secret}"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["round"] == 1 and body["version"] == 0 and body["job"] == "j1"
    return dict(body["tokens"])


def upload(
    gw: GatewayThread,
    tokens: dict[str, str],
    client: str,
    body: bytes,
    *,
    rnd: int = 1,
    samples: str = "10",
    job: str = "j1",
    token: str | None = None,
) -> httpx.Response:
    headers = {"X-Client-Id": client, "X-Sample-Count": samples}
    tok = tokens.get(client) if token is None else token
    if tok:
        headers["Authorization"] = f"Bearer {tok}"
    return httpx.post(f"{gw.url}/v1/jobs/{job}/rounds/{rnd}/updates", content=body, headers=headers)


def raw_request(
    gw: GatewayThread, head: str, body: bytes = b"", *, shut: bool = False
) -> tuple[int, dict]:
    s = socket.create_connection(("127.0.0.1", gw.gw.port), timeout=10)
    try:
        s.sendall(head.encode() + body)
        if shut:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head_raw, _, rest = data.partition(b"\r\n\r\n")
        status = int(head_raw.split(b" ")[1])
        length = next(
            int(line.split(b":")[1])
            for line in head_raw.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, json.loads(rest)
    finally:
        s.close()


def state(gw: GatewayThread) -> tuple[list[str], int, int]:
    j = gw.gw.jobs["j1"]
    return j.ns.keys(), j.engine.accepted if j.engine else -1, j.version


def test_good_update_is_sealed_journaled_and_answered_202(
    gw: GatewayThread, job: dict[str, str], redis_url: str
) -> None:
    r = upload(gw, job, "c1", tiny_bytes(1))
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["round"] == 1 and body["client"] == "c1" and len(body["key"]) == 32
    ns = gw.gw.jobs["j1"].ns
    assert ns.sealed(body["key"])
    with ns.open(body["key"]) as obj:
        h = wire.read_header(obj.buf)
        assert (h.kind, h.weight, h.round) == (wire.KIND_UPDATE, 10.0, 1)
        views = wire.tensor_views(obj.buf, gw.gw.jobs["j1"].spec)
        np.testing.assert_array_equal(views["layer.weight"], tiny_model(1)["layer.weight"])
        del views
    rec = redis_url.client().hget("fedfaas:job:j1:round:1", "c1")
    assert rec is not None and json.loads(rec)["key"] == body["key"]


def _hdr(entries: dict) -> bytes:
    raw = json.dumps(entries).encode()
    return struct.pack("<Q", len(raw)) + raw


GOOD = tiny_model(1)


def _bad_bodies() -> dict[str, tuple[bytes, int, str]]:
    good = wire.encode_tensors(GOOD)
    nan = dict(GOOD, **{"layer.bias": np.full(8, np.nan, np.float32)})
    inf = dict(GOOD, **{"layer.weight": np.full((8, 5), np.inf, np.float32)})
    renamed = {("x" if k == "layer.bias" else k): v for k, v in GOOD.items()}
    reshaped = dict(GOOD, **{"layer.weight": GOOD["layer.weight"].reshape(5, 8)})
    retyped = dict(GOOD, **{"layer.bias": GOOD["layer.bias"].astype(np.float64)})
    big_meta = wire.encode_tensors(GOOD, {"pad": "x" * 5000})
    return {
        "malformed": (
            struct.pack("<Q", 12) + b"{not json!!}" + good[8:][:10],
            400,
            "malformed_safetensors",
        ),
        "header_too_large": (struct.pack("<Q", 10**6) + good[8:], 413, "header_too_large"),
        "header_too_large_for_content_length": (big_meta, 413, "body_too_large"),
        "names": (wire.encode_tensors(renamed), 400, "spec_mismatch"),
        "shapes": (wire.encode_tensors(reshaped), 400, "spec_mismatch"),
        "dtypes": (wire.encode_tensors(retyped), 400, "spec_mismatch"),
        "nan": (wire.encode_tensors(nan), 422, "non_finite"),
        "inf": (wire.encode_tensors(inf), 422, "non_finite"),
        "extra_bytes": (good + b"\0" * 8, 400, "size_mismatch"),
        "short_data": (good[:-4], 400, "size_mismatch"),
        "oversized": (good + b"\0" * 10000, 413, "body_too_large"),
    }


@pytest.mark.parametrize("case", list(_bad_bodies()))
def test_bad_body_is_a_clear_4xx_that_leaves_store_and_round_unchanged(
    gw: GatewayThread, job: dict[str, str], case: str
) -> None:
    before = state(gw)
    body, status, code = _bad_bodies()[case]
    r = upload(gw, job, "c2", body)
    assert r.status_code == status, r.text
    assert r.json()["error"] == code and r.json()["detail"]
    assert state(gw) == before
    assert upload(gw, job, "c2", tiny_bytes(2)).status_code == 202  # the client can still upload


@pytest.mark.parametrize(
    ("kw", "status", "code"),
    [
        ({"rnd": 2}, 409, "future_round"),
        ({"rnd": 0}, 409, "stale_round"),
        ({"job": "nope"}, 401, "unauthorized"),  # no job is named to a non-admin
        ({"token": ""}, 401, "unauthorized"),
        ({"token": "0" * 64}, 401, "unauthorized"),
        ({"samples": "0"}, 400, "bad_sample_count"),
        ({"samples": "ten"}, 400, "bad_sample_count"),
    ],
)
def test_bad_request_metadata_is_refused_before_the_body(
    gw: GatewayThread, job: dict[str, str], kw: dict, status: int, code: str
) -> None:
    before = state(gw)
    r = upload(gw, job, "c3", tiny_bytes(3), **kw)
    assert r.status_code == status, r.text
    assert r.json()["error"] == code
    assert state(gw) == before


def test_unknown_client_and_other_clients_token_are_refused(
    gw: GatewayThread, job: dict[str, str]
) -> None:
    assert upload(gw, job, "intruder", tiny_bytes(1), token=job["c1"]).status_code == 401
    assert upload(gw, job, "c2", tiny_bytes(1), token=job["c1"]).status_code == 401


def test_same_client_twice_in_a_round_is_refused(gw: GatewayThread, job: dict[str, str]) -> None:
    assert upload(gw, job, "c4", tiny_bytes(4)).status_code == 202
    before = state(gw)
    r = upload(gw, job, "c4", tiny_bytes(5))
    assert r.status_code == 409 and r.json()["error"] == "duplicate_client"
    assert state(gw) == before


def _head(gw: GatewayThread, tokens: dict[str, str], extra: str) -> str:
    return (
        f"POST /v1/jobs/j1/rounds/1/updates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tokens['c5']}\r\n"
        f"X-Client-Id: c5\r\nX-Sample-Count: 3\r\n{extra}\r\n"
    )


def test_missing_content_length_is_411(gw: GatewayThread, job: dict[str, str]) -> None:
    before = state(gw)
    status, body = raw_request(gw, _head(gw, job, ""), shut=True)
    assert (status, body["error"]) == (411, "length_required")
    assert state(gw) == before


def test_chunked_body_is_411(gw: GatewayThread, job: dict[str, str]) -> None:
    status, body = raw_request(
        gw, _head(gw, job, "Transfer-Encoding: chunked\r\n"), b"5\r\nhello\r\n0\r\n\r\n"
    )
    assert (status, body["error"]) == (411, "length_required")


def test_truncated_body_is_400_and_frees_its_buffer(gw: GatewayThread, job: dict[str, str]) -> None:
    before = state(gw)
    data = tiny_bytes(5)
    status, body = raw_request(
        gw, _head(gw, job, f"Content-Length: {len(data)}\r\n"), data[: len(data) // 2], shut=True
    )
    assert (status, body["error"]) == (400, "truncated_body")
    assert state(gw) == before


def test_content_length_disagreeing_with_the_header_is_400(
    gw: GatewayThread, job: dict[str, str]
) -> None:
    before = state(gw)
    data = tiny_bytes(5) + b"\0" * 16
    status, body = raw_request(gw, _head(gw, job, f"Content-Length: {len(data)}\r\n"), data)
    assert (status, body["error"]) == (400, "size_mismatch")
    assert state(gw) == before


def test_model_get_has_etag_and_answers_304(gw: GatewayThread, job: dict[str, str]) -> None:
    auth = {"Authorization": f"Bearer {job['c0']}"}
    r = httpx.get(gw.url + "/v1/jobs/j1/model", headers=auth)
    assert (
        r.status_code == 200 and r.headers["etag"] == '"v0"' and r.headers["x-model-version"] == "0"
    )
    assert r.content == tiny_bytes(0)
    r2 = httpx.get(gw.url + "/v1/jobs/j1/model", headers={**auth, "If-None-Match": '"v0"'})
    assert r2.status_code == 304
    assert httpx.get(gw.url + "/v1/jobs/j1/model").status_code == 401


def test_job_creation_validates_its_input(gw: GatewayThread) -> None:
    admin = {"Authorization": f"Bearer {gw.gw.secret}"}
    p = {"job": "ok-1", "rounds": 1, "goal": 1, "clients": "a"}
    assert httpx.post(gw.url + "/v1/jobs", params=p, content=tiny_bytes(0)).status_code == 401
    assert (
        httpx.post(
            gw.url + "/v1/jobs",
            params={**p, "job": "Bad_Name"},
            content=tiny_bytes(0),
            headers=admin,
        ).status_code
        == 400
    )
    assert (
        httpx.post(
            gw.url + "/v1/jobs", params={**p, "goal": 2}, content=tiny_bytes(0), headers=admin
        ).status_code
        == 400
    )
    assert (
        httpx.post(gw.url + "/v1/jobs", params=p, content=b"garbage!", headers=admin).status_code
        == 400
    )
    assert (
        httpx.post(gw.url + "/v1/jobs", params=p, content=tiny_bytes(0), headers=admin).status_code
        == 201
    )
    r = httpx.post(gw.url + "/v1/jobs", params=p, content=tiny_bytes(0), headers=admin)
    assert r.status_code == 409 and r.json()["error"] == "job_exists"


def test_health_and_metrics(gw: GatewayThread, job: dict[str, str]) -> None:
    h = httpx.get(gw.url + "/healthz").json()
    assert h["status"] == "ok" and h["router"] == "userspace"
    upload(gw, job, "c0", tiny_bytes(1))
    m = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {gw.gw.secret}"}).text
    assert "fedfaas_gateway_updates_accepted_total 1.0" in m
    assert 'fedfaas_gateway_store_objects{job="j1"}' in m


def test_delete_job_frees_its_objects_and_journal(
    gw: GatewayThread, job: dict[str, str], redis_url: str
) -> None:
    assert upload(gw, job, "c1", tiny_bytes(1)).status_code == 202
    path = gw.gw.jobs["j1"].ns.path
    assert httpx.delete(gw.url + "/v1/jobs/j1").status_code == 401
    r = httpx.delete(gw.url + "/v1/jobs/j1", headers={"Authorization": f"Bearer {gw.gw.secret}"})
    assert r.status_code == 204
    assert not path.exists() and "j1" not in gw.gw.jobs
    assert redis_url.client().hget("fedfaas:jobs", "j1") is None
    admin = {"Authorization": f"Bearer {gw.gw.secret}"}
    assert httpx.get(gw.url + "/v1/jobs/j1", headers=admin).status_code == 404


def test_stalled_upload_is_dropped_and_frees_its_buffer(tmp_path: Path, redis_url: str) -> None:
    # the upload is seen in flight between its first bytes and its read timeout: 2 s, so a test
    # thread descheduled on a loaded machine still sees it
    g = GatewayThread(settings(tmp_path, redis_url, read_timeout=2.0)).start()
    try:
        r = httpx.post(
            g.url + "/v1/jobs",
            params={"job": "j1", "rounds": 1, "goal": 2, "clients": "c0,c1"},
            content=tiny_bytes(0),
            headers={"Authorization": f"Bearer {g.gw.secret}"},
        )
        tokens = r.json()["tokens"]
        before = state(g)
        data = tiny_bytes(1)
        s = socket.create_connection(("127.0.0.1", g.gw.port), timeout=10)
        s.sendall(
            (
                f"POST /v1/jobs/j1/rounds/1/updates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{tokens['c0']}\r\nX-Client-Id: c0\r\nX-Sample-Count: 1\r\n"
                f"Content-Length: {len(data)}\r\n\r\n"
            ).encode()
            + data[:40]
        )
        deadline = time.monotonic() + 5
        while not g.gw.jobs["j1"].inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert g.gw.jobs["j1"].inflight == {"c0"}  # the upload holds its buffer...
        assert s.recv(100) == b""  # closed by the gateway after read_timeout
        s.close()
        assert state(g) == before and not g.gw.jobs["j1"].inflight
        assert upload(g, tokens, "c0", tiny_bytes(1)).status_code == 202
    finally:
        g.stop()
        shutil.rmtree(g.settings.shm_root, ignore_errors=True)
